"""Why a job waits and when it should start (sftq.waiting_reason, sftq.forecast, sftq.queue_view):
every reason code with its message, one walk shared with admission and the preview, and the
forward simulation of admission checked against hand-computed schedules."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

from .conftest import Q, t

TICK = timedelta(seconds=30)
GRACE = timedelta(minutes=5)

MESSAGES = {
    "behind_own_running_job": "You have 1 running job and may run 1 at a time: this job is "
    "admitted when one of them ends.",
    "behind_own_queued_job": "Behind 1 of your own earlier queued job: your jobs start in the "
    "order you submitted them.",
    "next_tick": "Eligible, and it fits (4 GPUs needed, 12 free): the next scheduler tick "
    "admits it.",
    "does_not_fit": "First in line, but it needs 16 GPUs while 8 are free: it is admitted when "
    "running jobs free enough GPUs.",
    "behind_job_that_does_not_fit": "Behind an earlier job that needs 16 GPUs while 8 are free: "
    "strict FIFO lets no later job start before it.",
    "user_disabled": "Your account is disabled: its queued jobs are not admitted until an "
    "administrator enables it again.",
}


def tick(q: Q, at: datetime, limit: int | None = 16, usage: float = 0) -> None:
    """A finished scheduler tick at `at` that read the quota (or could not: limit None)."""
    tick_id = q.one("SELECT sftq.tick_begin('test', interval '2 minutes', %s)", at)
    result: dict[str, Any] = {"admitted": 0}
    if limit is not None:
        result |= {"quota_limit": limit, "quota_usage": usage}
    q.one("SELECT sftq.tick_finish(%s, %s::jsonb, %s)", tick_id, json.dumps(result), at)


def view(q: Q, user: int, now: datetime, **kw: Any) -> dict[UUID, dict[str, Any]]:
    cur = q.conn.execute(
        "SELECT * FROM sftq.queue_view(%s, %s, %s, %s)", (user, now, kw.get("tick", TICK), GRACE)
    )
    assert cur.description is not None
    names = [d.name for d in cur.description]
    return {UUID(str(r[0])): dict(zip(names, r, strict=True)) for r in cur.fetchall()}


def everyone(q: Q, users: dict[str, int], now: datetime) -> dict[UUID, dict[str, Any]]:
    out: dict[UUID, dict[str, Any]] = {}
    for uid in users.values():
        out |= view(q, uid, now)
    return out


@pytest.fixture
def world(q: Q) -> dict[str, Any]:
    """A queue that shows every reason code but scheduler_stalled (which needs a clock).

    Quota 16, nothing else using it; a's 4-GPU job runs (submitted at t(1), still within the
    usage grace, so admission counts it itself): 12 GPUs free. FIFO: a1 a2 b1 c1 d1 e1.
    """
    users = {n: q.user(f"waiter-{n}") for n in "abcde"}
    ra = q.enqueue(users["a"], at=t(0))
    assert q.admit(16, at=t(1)) == [ra]
    q.submitted(ra, at=t(1))
    jobs = {
        "ra": ra,
        "a1": q.enqueue(users["a"], gpus=4, at=t(2)),
        "a2": q.enqueue(users["a"], gpus=4, at=t(3)),
        "b1": q.enqueue(users["b"], gpus=4, at=t(4)),
        "c1": q.enqueue(users["c"], gpus=16, at=t(5)),
        "d1": q.enqueue(users["d"], gpus=2, at=t(6)),
        "e1": q.enqueue(users["e"], gpus=4, at=t(7)),
    }
    q.one("SELECT sftq.set_user_disabled('waiter-e', true)")
    tick(q, t(10))
    return {"users": users, "jobs": jobs}


def test_every_reason_code_and_its_message(q: Q, world: dict[str, Any]) -> None:
    jobs, users = world["jobs"], world["users"]
    got = everyone(q, users, t(20))
    expected = {
        "a1": "behind_own_running_job",
        # a is at cap too, but a2's earlier queued job is the better answer.
        "a2": "behind_own_queued_job",
        "b1": "next_tick",
        "c1": "does_not_fit",
        "d1": "behind_job_that_does_not_fit",
        "e1": "user_disabled",
    }
    for name, code in expected.items():
        row = got[jobs[name]]
        assert (row["waiting_code"], row["waiting_message"]) == (code, MESSAGES[code]), name
    # Positions are the contract's (other users' queued jobs ahead), unchanged.
    assert [got[jobs[n]]["queue_position"] for n in ("a1", "a2", "b1", "d1")] == [0, 0, 2, 4]
    # No message names another user or another user's job.
    everything = " ".join(str(r["waiting_message"]) for r in got.values())
    assert "waiter" not in everything
    for job in jobs.values():
        assert str(job) not in everything


def test_scheduler_stalled_when_no_tick_for_three_intervals(q: Q, world: dict[str, Any]) -> None:
    jobs, users = world["jobs"], world["users"]
    # Last tick at t(10): still fine after 3 intervals (90 s), stalled after.
    assert everyone(q, users, t(100))[jobs["b1"]]["waiting_code"] == "next_tick"
    late = everyone(q, users, t(250))
    for name in ("a1", "a2", "b1", "c1", "d1"):
        row = late[jobs[name]]
        assert row["waiting_code"] == "scheduler_stalled", name
        assert row["waiting_message"] == (
            "The scheduler has not run for 4 minutes (it should run every 30 seconds): "
            "nothing is admitted until it is back.")
        assert row["estimated_start_at"] is None
        assert row["estimate_basis"].startswith("no estimate: the scheduler is not running")
    # A disabled user's job says so first.
    assert late[jobs["e1"]]["waiting_code"] == "user_disabled"
    # The interval is the deployment's: with 120 s ticks, 240 s is not a stall yet.
    slow = view(q, users["b"], t(250), tick=timedelta(seconds=120))
    assert slow[jobs["b1"]]["waiting_code"] == "next_tick"


def test_scheduler_stalled_before_the_first_tick_and_without_a_quota(q: Q) -> None:
    a = q.user("a")
    job = q.enqueue(a, at=t(0))
    row = view(q, a, t(5))[job]
    assert row["waiting_code"] == "scheduler_stalled"
    assert row["waiting_message"] == (
        "The scheduler has not run yet: nothing is admitted until it does.")
    # Ticks that run but cannot read the quota admit nothing either.
    tick(q, t(10))
    for s in (40, 70, 100, 130):
        tick(q, t(s), limit=None)
    row = view(q, a, t(131))[job]
    assert row["waiting_code"] == "scheduler_stalled"
    assert row["waiting_message"] == (
        "The scheduler has not been able to read the GPU quota from the provider for "
        "2 minutes: nothing is admitted until it can.")
    tick(q, t(160))
    assert view(q, a, t(161))[job]["waiting_code"] == "next_tick"


def test_reasons_preview_and_admission_are_one_walk(q: Q, world: dict[str, Any]) -> None:
    jobs, users = world["jobs"], world["users"]
    reasons = {k: v["waiting_code"] for k, v in everyone(q, users, t(20)).items()}
    preview = {UUID(str(r[0])): (r[1], r[2]) for r in q.all(
        "SELECT job_id, decision, code FROM sftq.preview_admission(12)")}
    assert {k: v[1] for k, v in preview.items()} == reasons
    assert {k for k, v in preview.items() if v[0] == "admit"} == {jobs["b1"]}
    # Admission at that moment admits exactly the next_tick jobs.
    answer = q.one("SELECT sftq.admit_for_quota(16, 0, %s, %s)", GRACE, t(20))
    assert answer["budget"] == 12
    assert {UUID(j["job_id"]) for j in answer["jobs"]} == {
        k for k, v in reasons.items() if v == "next_tick"}


def test_cap_zero_and_cap_two(q: Q) -> None:
    a, b = q.user("a", cap=0), q.user("b", cap=2)
    ja = q.enqueue(a, at=t(0))
    b1, b2, b3 = (q.enqueue(b, gpus=1, at=t(1 + i)) for i in range(3))
    tick(q, t(5))
    got = view(q, a, t(6)) | view(q, b, t(6))
    assert got[ja]["waiting_code"] == "behind_own_running_job"
    assert got[ja]["waiting_message"] == (
        "Your cap on running jobs is 0: none of your jobs is admitted until an administrator "
        "raises it.")
    assert got[ja]["estimated_start_at"] is None
    # One admission per user per walk, even below the cap: b2 waits behind b1.
    assert [got[j]["waiting_code"] for j in (b1, b2, b3)] == [
        "next_tick", "behind_own_queued_job", "behind_own_queued_job"]
    assert got[b3]["waiting_message"].startswith("Behind 2 of your own earlier queued jobs:")
    # The forecast admits b2 at the tick after b1 (cap 2), b3 when one of them ends.
    assert got[b1]["estimated_start_at"] == t(35)
    assert got[b2]["estimated_start_at"] == t(65)
    assert got[b3]["estimated_start_at"] == t(35 + 3600)


# --- estimates ---------------------------------------------------------------------------------

def test_estimates_simulate_strict_fifo_with_default_run_times(q: Q, world: dict[str, Any]) -> None:
    jobs, users = world["jobs"], world["users"]
    got = everyone(q, users, t(20))
    # No history: every run takes the default hour. Ticks: t(10) + k * 30 s.
    # t(40): b1 fits (12 free -> 8); c1 (16) blocks everything after it.
    # t(3610): ra ends (started t(1)): a1, earlier than c1, goes first (8 + 4 - 4 = 8 free).
    # t(3640): b1 ends (12 free); c1 still does not fit.
    # t(7210): a1 ends (16 free): a2, also earlier than c1, goes first (12 free).
    # t(10810): a2 ends: c1 at last. t(14410): c1 ends: d1.
    starts = {n: got[jobs[n]]["estimated_start_at"] for n in ("b1", "a1", "a2", "c1", "d1")}
    assert starts == {"b1": t(40), "a1": t(3610), "a2": t(7210), "c1": t(10810),
                      "d1": t(14410)}
    assert got[jobs["e1"]]["estimated_start_at"] is None
    assert got[jobs["e1"]]["estimate_basis"] == "no estimate: your account is disabled"
    assert got[jobs["b1"]]["estimate_basis"].startswith(
        "simulated strict-FIFO admission with 2 jobs ahead, 1 running and 12 free GPUs")


def test_running_jobs_end_by_progress_else_recent_medians_else_the_default(q: Q) -> None:
    h, a = q.user("h"), q.user("a")
    # History: three 4-GPU SFT runs of 30, 40 and 50 minutes, and one 8-GPU run (another class).
    for i, minutes in enumerate((30, 40, 50)):
        job = q.enqueue(h, at=t(-100_000 + i * 10_000))
        q.admit(64, at=t(-100_000 + i * 10_000))
        q.submitted(job, at=t(-100_000 + i * 10_000))
        q.provider_state(job, "JOB_STATE_COMPLETED", at=t(-100_000 + i * 10_000 + minutes * 60))
    big = q.enqueue(h, gpus=8, at=t(-50_000))
    q.admit(64, at=t(-50_000))
    q.provider_state(big, "JOB_STATE_COMPLETED", at=t(-50_000 + 600))
    run = q.enqueue(a, gpus=3, at=t(0))  # 3 GPUs: the same class as 4
    q.admit(64, at=t(0))
    q.submitted(run, at=t(0))

    def finish(now: datetime) -> tuple[datetime, str]:
        got = q.one("SELECT sftq.job_analytics(%s, %s, %s, %s, %s)", a, run, now, TICK, GRACE)
        return datetime.fromisoformat(got["estimated_finish_at"]), got["estimate"]["basis"]

    at, basis = finish(t(60))
    assert at == t(2400)
    assert basis == ("median run time of 3 SFT jobs on 3-4 GPUs that finished in the last "
                     "30 days")
    # Past the median: the median of the similar jobs that ran at least as long (50 min).
    at, basis = finish(t(2700))
    assert at == t(3000)
    assert basis == ("median run time of the 1 similar job that ran longer than its 45 minutes "
                     "so far")
    # Past all of them: any moment now.
    at, basis = finish(t(4000))
    assert at == t(4000) and basis.startswith("already running longer (67 minutes)")
    # The provider's progress wins: 5% at 5 min, 10% at 10 min -> done at 100 min.
    for at_s, pct in ((300, 5), (600, 10)):
        q.one("SELECT sftq._event(%s, %s, 'scheduler', 'provider_state', 'PROGRESS', %s::jsonb)",
              run, t(at_s), json.dumps({"provider_state": "JOB_STATE_RUNNING",
                                        "progress_percent": pct}))
    at, basis = finish(t(700))
    assert at == t(6000)
    assert basis == "from the provider's progress: 10% after 10 minutes"
    # Nothing similar in 30 days: the default hour.
    other = q.user("o")
    dpo = q.enqueue(other, "DPO", gpus=16, at=t(0))
    q.admit(64, at=t(0))
    got = q.one("SELECT sftq.job_analytics(%s, %s, %s, %s, %s)", other, dpo, t(10), TICK, GRACE)
    assert datetime.fromisoformat(got["estimated_finish_at"]) == t(3600)
    assert got["estimate"]["basis"] == (
        "default run time of 60 minutes: no DPO job on a similar GPU count finished in the "
        "last 30 days")


def test_a_job_that_can_never_fit_has_no_estimate(q: Q) -> None:
    a, b = q.user("a"), q.user("b")
    huge = q.enqueue(a, gpus=32, at=t(0))
    after = q.enqueue(b, gpus=1, at=t(1))
    tick(q, t(5), limit=16)
    got = view(q, a, t(6)) | view(q, b, t(6))
    assert got[huge]["waiting_code"] == "does_not_fit"
    for job in (huge, after):
        assert got[job]["estimated_start_at"] is None
        assert got[job]["estimate_basis"] == (
            "no estimate: the job first in line needs 32 GPUs, more than can become free "
            "under the GPU quota as last read")


def test_beyond_the_simulated_window_estimates_are_extrapolated(q: Q) -> None:
    users = [q.user(f"u{i}") for i in range(6)]
    mine = q.user("me")
    for i in range(12):
        q.enqueue(users[i % 6], gpus=4, at=t(i))
    for i in range(2):
        q.enqueue(mine, gpus=4, at=t(20 + i))
    tick(q, t(25), limit=8)

    def forecast(window: int, steps: int) -> list[tuple[Any, ...]]:
        return q.all(
            "SELECT m.id, f.estimated_start_at, f.basis FROM sftq.my_queue(%s) m "
            "JOIN sftq.forecast(%s, (SELECT array_agg(id ORDER BY k) FROM sftq.my_queue(%s)), "
            "  (SELECT array_agg(queue_position + k - 1 ORDER BY k) FROM sftq.my_queue(%s)), "
            "  (SELECT array_agg(kind ORDER BY k) FROM sftq.my_queue(%s)), "
            "  (SELECT array_agg(gpu_count ORDER BY k) FROM sftq.my_queue(%s)), "
            "  %s, 8, %s, %s, NULL, %s, %s) f ON f.job_id = m.id ORDER BY m.k",
            mine, mine, mine, mine, mine, mine, t(26), t(25), TICK, window, steps)

    exact = forecast(1000, 500)
    # 8 GPUs: two 4-GPU jobs an hour. 12 ahead: my first goes at the 7th hour's tick, my
    # second (cap 1) when it ends.
    assert [r[1] for r in exact] == [t(55 + 6 * 3600), t(55 + 7 * 3600)]
    assert all(r[2].startswith("simulated") for r in exact)
    # A window of 4 jobs: the simulation stops where it ends and extrapolates the rest at
    # its own admission rate; the estimate lands within an hour of the exact one.
    approx = forecast(4, 500)
    for (_, exact_at, _), (_, at, basis) in zip(exact, approx, strict=True):
        assert re.match(r"extrapolated: 1[23] jobs ahead, beyond the 4 admissions simulated, "
                        r"at their rate of 2\.0 jobs per hour", basis), basis
        assert abs((at - exact_at).total_seconds()) <= 3600
    # The user's own cap: the second job does not start before the first ends.
    assert approx[1][1] - approx[0][1] >= timedelta(seconds=3600)


def test_fixed_run_time_baseline(q: Q, world: dict[str, Any]) -> None:
    jobs, users = world["jobs"], world["users"]
    rows = q.all("SELECT id, estimated_start_at, estimate_basis FROM sftq.queue_view("
                 "%s, %s, %s, %s, 'infinity', 'ffffffff-ffff-ffff-ffff-ffffffffffff', 600)",
                 users["a"], t(20), TICK, GRACE)
    got = {UUID(str(r[0])): (r[1], r[2]) for r in rows}
    # ra ends at t(601) -> tick t(610): a1; a1 ends t(1210): a2.
    assert got[jobs["a1"]][0] == t(610) and got[jobs["a2"]][0] == t(1210)
    assert got[jobs["a1"]][1].endswith("fixed run time of 10 minutes per job")


def test_estimates_cost_is_bounded_by_the_window_not_the_queue(q: Q) -> None:
    """A user at the end of a long queue gets an estimate (extrapolated) without the
    simulation walking the whole queue; the simulation's own step count is capped."""
    users = [q.user(f"u{i}") for i in range(50)]
    q.conn.execute(
        "INSERT INTO sftq.jobs (user_id, kind, gpu_count, fireworks_payload, created_at) "
        "SELECT (%s::bigint[])[1 + i %% 50], 'SFT', 4, '{}', %s + i * interval '1 ms' "
        "FROM generate_series(0, 4999) i", (users, t(0)))
    q.conn.execute(
        "UPDATE sftq.users u SET queued_count = s.n, head_job_id = s.id, head_created_at = s.c "
        "FROM (SELECT DISTINCT ON (user_id) user_id, id, created_at AS c, "
        "count(*) OVER (PARTITION BY user_id) AS n FROM sftq.jobs WHERE state = 'QUEUED' "
        "ORDER BY user_id, created_at, id) s WHERE s.user_id = u.id")
    me = q.user("me")
    mine = q.enqueue(me, at=t(10))
    tick(q, t(11), limit=64)
    row = view(q, me, t(12))[mine]
    assert row["queue_position"] == 5000
    assert row["waiting_code"] == "next_tick" or row["waiting_code"].startswith("behind")
    assert re.match(r"extrapolated: 5000 jobs ahead, beyond the (3\d\d) admissions simulated",
                    row["estimate_basis"])
    # 64 GPUs / 4 = 16 jobs an hour: 5000 ahead is about 312 hours away.
    hours = (row["estimated_start_at"] - t(12)).total_seconds() / 3600
    assert 250 < hours < 380


def test_the_streams_progress_frames_carry_the_same_finish_estimate(q: Q) -> None:
    a = q.user("a")
    job = q.enqueue(a, at=t(0))
    q.admit(8, at=t(0))
    q.submitted(job, at=t(0))
    q.one("SELECT sftq._event(%s, now() - interval '10 minutes', 'scheduler', 'provider_state', "
          "'PROGRESS', '{\"progress_percent\": 10}')", job)
    frame = q.one("SELECT sftq.stream_estimated_finish(j, '{}'::jsonb) FROM sftq.jobs j "
                  "WHERE j.id = %s", job)
    analytics = q.one("SELECT sftq.job_analytics(%s, %s)", a, job)
    assert frame is not None
    assert datetime.fromisoformat(analytics["estimated_finish_at"]) == frame
    q.provider_state(job, "JOB_STATE_COMPLETED")
    assert q.one("SELECT sftq.stream_estimated_finish(j, '{}'::jsonb) FROM sftq.jobs j "
                 "WHERE j.id = %s", job) is None
