"""The GPU budget against the simulator's usage (issue 19): a job the provider's usage already
shows is not counted twice, and a job it does not show yet is never left out, with usage
lagging and external usage moving between ticks."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest
from sched_support import (
    ACCOUNT,
    RecordingSimulator,
    create_user,
    enqueue,
    job,
    pid,
    progress_ids,
    state,
)

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.provider import FireworksClient, ProviderJob
from sftq_server.scheduler.tick import run_tick

Conn = psycopg.Connection[Any]


def _ours(conn: Conn) -> int:
    row = conn.execute("SELECT COALESCE(sum(gpu_count), 0) FROM sftq.jobs "
                       "WHERE state = 'PROGRESS'").fetchone()
    assert row is not None
    return int(row[0])


def test_no_lag_admits_what_the_contract_admits_at_the_next_tick(
        conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    sim.set_quota(max_value=8, usage_lag_seconds=0)
    first = enqueue(conn, create_user(conn, "alice"))
    result = tick()
    assert result["admitted"] == [str(first)]
    # The reading after the create already shows the job: it is not counted again.
    assert result["usage_after"] == 4 and result["usage_counted_gpus"] == 4
    second = enqueue(conn, create_user(conn, "bob"))
    result = tick()
    # usage 4 of 8: the contract admits a 4-GPU job, and so do we.
    assert (result["quota"]["usage"], result["ours_recent"], result["budget"]) == (4, 0, 4)
    assert result["admitted"] == [str(second)]
    third = enqueue(conn, create_user(conn, "carol"))
    result = tick()
    assert result["budget"] == 0 and result["admitted"] == []
    assert state(conn, third) == "QUEUED"


def test_a_lagging_usage_keeps_our_new_jobs_counted(conn: Conn, sim: RecordingSimulator,
                                                    tick: Any) -> None:
    sim.set_quota(max_value=8, usage_lag_seconds=60)
    first = enqueue(conn, create_user(conn, "alice"))
    result = tick()
    assert result["usage_after"] == 0 and result["usage_counted_gpus"] == 0
    second = enqueue(conn, create_user(conn, "bob"))
    third = enqueue(conn, create_user(conn, "carol"))
    result = tick()
    # usage says 0, but our first job holds 4: only one more fits.
    assert (result["quota"]["usage"], result["ours_recent"], result["budget"]) == (0, 4, 4)
    assert result["admitted"] == [str(second)]
    sim.advance(61)  # the provider's usage shows both now
    result = tick()
    assert result["quota"]["usage"] == 8 and result["budget"] <= 0
    assert state(conn, third) == "QUEUED" and _ours(conn) == 8
    assert progress_ids(conn) == {first, second}


class EndsOneOfOursDuringCreates(FireworksClient):
    """Before its third create, one of our running jobs ends at the provider."""

    def __init__(self, sim: RecordingSimulator, leaving: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sim, self.leaving, self.creates = sim, leaving, 0

    def create_job(self, kind: str, job_id: str, payload: dict[str, Any], *,
                   gpu_count: int | None = None) -> ProviderJob:
        self.creates += 1
        if self.creates == 3:
            self.sim.finish("SFT", self.leaving, "JOB_STATE_COMPLETED")
        return super().create_job(kind, job_id, payload, gpu_count=gpu_count)


def test_several_creates_in_one_tick_are_credited_only_as_far_as_the_usage_rose(
        conn: Conn, sim: RecordingSimulator, database: Database, settings: Settings,
        tick: Any) -> None:
    sim.set_quota(max_value=4, usage_lag_seconds=0)
    leaving = enqueue(conn, create_user(conn, "early"), gpus=4)
    tick()
    sim.set_quota(max_value=16)
    jobs = [enqueue(conn, create_user(conn, f"u{i}"), gpus=g) for i, g in enumerate((4, 2, 4))]
    with EndsOneOfOursDuringCreates(sim, pid(leaving), base_url=settings.fireworks_base_url,
                                    api_key=settings.fireworks_api_key,
                                    account_id=ACCOUNT) as provider:
        result = run_tick(database, provider, settings)
    assert result["admitted"] == [str(j) for j in jobs]
    # Between the two readings: +10 created, -4 ended, a rise of 6. Whole jobs, oldest
    # first, up to the rise: the first two (4 + 2), not the third.
    assert (result["quota"]["usage"], result["usage_after"]) == (4, 10)
    assert result["usage_counted_gpus"] == 6
    counted = dict(conn.execute("SELECT id, usage_counted_at IS NOT NULL FROM sftq.jobs "
                                "WHERE id = ANY(%s)", (jobs,)).fetchall())
    assert [counted[j] for j in jobs] == [True, True, False]
    result = tick()  # the ended job is reconciled; the third job is still counted on top
    assert result["ours_total"] == 10 and result["ours_recent"] == 4
    assert result["budget"] == 16 - (10 + 4)


def test_a_create_left_to_a_later_tick_waits_while_the_room_it_was_admitted_into_is_gone(
        conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    """A tick admits two jobs into an empty quota and dies before creating them (or loses
    its lease). Usage outside the queue then takes half the quota. The next tick's reading
    has room for the first job only: it creates that one and holds the second (same place,
    slot and GPUs, no attempt counted, the reason on the job) until room comes back. No
    create ever reaches the provider without room at its true usage."""
    sim.set_quota(max_value=8, usage_lag_seconds=60)
    first = enqueue(conn, create_user(conn, "alice"))
    second = enqueue(conn, create_user(conn, "bob"))
    # What a tick that died right after admission leaves behind.
    admitted = conn.execute("SELECT sftq.admit_for_quota(8, 0)").fetchone()
    assert admitted is not None and admitted[0]["budget"] == 8
    assert progress_ids(conn) == {first, second}

    sim.set_quota(external_usage=4)
    result = tick()
    assert result["submitted"] == 1 and result["creates_held"] == 1
    assert pid(first) in sim.sim_jobs() and pid(second) not in sim.sim_jobs()
    row = job(conn, second)
    assert (row["state"], row["submitted_at"], row["submit_attempts"]) == ("PROGRESS", None, 0)
    assert row["last_submit_error"] == (
        "waiting for room in the GPU quota: it needs 4 GPUs and the quota read now leaves 0 "
        "free for it (usage 4 of 8); the create is sent once it fits")
    # Still counted on top of usage: nothing else is admitted into its GPUs.
    assert result["budget"] == 8 - (4 + 4 + 4) and result["admitted"] == []
    assert sim.quota()["over_quota_creates"] == 0

    assert tick()["creates_held"] == 1 and job(conn, second)["submit_attempts"] == 0
    sim.set_quota(external_usage=0)  # the outside job ends: room again
    result = tick()
    assert result["submitted"] == 1 and result["creates_held"] == 0
    assert job(conn, second)["submitted_at"] is not None and pid(second) in sim.sim_jobs()
    assert sim.quota()["over_quota_creates"] == 0 and sim.quota()["true_usage"] == 8


def test_creates_that_fit_are_a_prefix_in_admission_order(conn: Conn) -> None:
    """sftq.creates_that_fit: the admitted, not yet created jobs in admission order, each
    with the room left before it; once one does not fit, no later one does, even a smaller
    one (a create is never sent ahead of an earlier admission)."""
    jobs = [enqueue(conn, create_user(conn, f"u{i}"), gpus=g) for i, g in enumerate((4, 2, 1))]
    conn.execute("SELECT sftq.admit_for_quota(8, 0)")
    rows = conn.execute("SELECT job_id, gpu_count, free_before, fits "
                        "FROM sftq.creates_that_fit(8, 3)").fetchall()
    # 8 - 3 outside = 5 free: the 4 fits, the 2 finds 1, the 1 after it waits too.
    assert rows == [(jobs[0], 4, 5, True), (jobs[1], 2, 1, False), (jobs[2], 1, -1, False)]
    rows = conn.execute("SELECT fits FROM sftq.creates_that_fit(8, 0)").fetchall()
    assert rows == [(True,), (True,), (True,)]


class StartsAnExternalJobDuringCreates(FireworksClient):
    """Someone else's job starts at the provider while this tick's create is in flight:
    inside the window between the tick's two quota readings."""

    def __init__(self, sim: RecordingSimulator, external: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sim, self.external = sim, external

    def create_job(self, kind: str, job_id: str, payload: dict[str, Any], *,
                   gpu_count: int | None = None) -> ProviderJob:
        created = super().create_job(kind, job_id, payload, gpu_count=gpu_count)
        self.sim.set_quota(external_usage=self.external)
        return created


@pytest.mark.parametrize("enforced", [True, False], ids=["provider-enforces", "provider-does-not"])
def test_an_external_rise_inside_the_window_is_taken_for_our_job(
        conn: Conn, sim: RecordingSimulator, database: Database, settings: Settings,
        tick: Any, enforced: bool) -> None:
    """The residual risk docs/scheduling.md states, step by step. With usage lagging, an
    external job that starts between a tick's two readings looks exactly like our new job
    being counted: the rise is credited to our job, and the next tick admits GPUs that are
    not free until the provider's usage shows our job. Fireworks refuses such a create
    (429 quota_exceeded): the job is retried, never failed, and created once room returns.
    A provider that did not enforce its quota would run over it until the lag passed."""
    sim.set_quota(max_value=8, usage_lag_seconds=60, enforce_quota=enforced)
    first = enqueue(conn, create_user(conn, "alice"))
    with StartsAnExternalJobDuringCreates(sim, 4, base_url=settings.fireworks_base_url,
                                          api_key=settings.fireworks_api_key,
                                          account_id=ACCOUNT) as racing:
        result = run_tick(database, racing, settings)
    assert result["admitted"] == [str(first)]
    # Our 4 GPUs are not shown yet (the lag); the external 4 are. A rise of 4: credited to us.
    assert (result["quota"]["usage"], result["usage_after"], result["usage_counted_gpus"]) == \
        (0, 4, 4)
    assert sim.quota()["true_usage"] == 8  # the account is full

    second = enqueue(conn, create_user(conn, "bob"))
    result = tick()
    # usage 4 is the external job; ours is taken as counted in it: 4 GPUs look free.
    assert (result["quota"]["usage"], result["ours_recent"], result["ours_total"],
            result["budget"]) == (4, 0, 4, 4)
    assert result["admitted"] == [str(second)]  # our 8 + the external 4: over the 8 by 4
    assert sim.quota()["over_quota_creates"] == 1 and result["failed"] == 0
    third = enqueue(conn, create_user(conn, "carol"))
    if not enforced:
        # Created: the provider holds 12 of 8 until its usage shows our jobs ...
        assert pid(second) in sim.sim_jobs() and sim.quota()["true_usage"] == 12
        sim.advance(61)
        result = tick()
        # ... and then the budget is right again: nothing more until usage falls.
        # (bob's job, shown now, is still counted on top too until a reading shows it)
        assert (result["quota"]["usage"], result["budget"]) == (12, 8 - (12 + 4))
        assert result["admitted"] == [] and state(conn, third) == "QUEUED"
        return

    # Refused by the provider: a 429, so the job keeps its place, slot and GPUs, and no
    # attempt is counted (a 429 is never the job's failure).
    row = job(conn, second)
    assert (row["state"], row["submitted_at"], row["submit_attempts"]) == ("PROGRESS", None, 0)
    assert "HTTP 429: quota_exceeded" in row["last_submit_error"]
    result = tick()
    # Unsubmitted, it counts on top of usage: nothing is admitted into its GPUs meanwhile.
    assert (result["ours_recent"], result["budget"]) == (4, 0) and result["admitted"] == []
    assert job(conn, second)["submit_attempts"] == 0 and result["failed"] == 0
    sim.advance(61)  # the provider's usage shows our first job: the budget is right again
    result = tick()
    assert (result["quota"]["usage"], result["budget"]) == (8, 8 - (8 + 4))
    # ... and the reading shows no room for bob's job: its create is held, not sent into
    # a third refusal, and no attempt is counted.
    row = job(conn, second)
    assert (row["state"], row["submitted_at"], row["submit_attempts"]) == ("PROGRESS", None, 0)
    assert row["last_submit_error"].startswith("waiting for room in the GPU quota: it needs 4")
    assert result["creates_held"] == 1 and sim.quota()["over_quota_creates"] == 2
    sim.set_quota(external_usage=0)  # the external job ends: room for ours
    result = tick()
    row = job(conn, second)
    assert result["submitted"] == 1 and row["submitted_at"] is not None
    # Created at its first counted attempt: the two 429s before it cost none.
    assert (row["state"], row["submit_attempts"], row["failure_class"]) == ("PROGRESS", 0, None)
    assert sim.created_ok()[pid(second)] == 1 and sim.quota()["over_quota_creates"] == 2
    assert state(conn, third) == "QUEUED"  # the account is full: 4 + 4 of 8


@pytest.mark.parametrize("lag", [0.0, 60.0])
def test_with_lag_and_external_usage_no_tick_ever_overspends(
        conn: Conn, sim: RecordingSimulator, tick: Any, lag: float) -> None:
    """Random arrivals, ends and external usage between ticks, the simulator's clock moving
    10 to 40 s a tick: after every tick that admitted anything, our GPUs plus the external
    ones stay within the quota. With no lag, the budget is the contract's own figure,
    limit - usage (floored by our own jobs), at every tick."""
    rng = random.Random(1900 + int(lag))
    limit = 16
    sim.set_quota(max_value=limit, usage_lag_seconds=lag)
    users = [create_user(conn, f"u{i}") for i in range(8)]
    admitted_total = 0
    for step in range(40):
        for _ in range(rng.randint(0, 3)):
            enqueue(conn, rng.choice(users), gpus=rng.choice((1, 2, 4, 4, 8)))
        for job_id in progress_ids(conn):
            if rng.random() < 0.25:
                sim.finish("SFT", pid(job_id), "JOB_STATE_COMPLETED")
        external = rng.choice((0, 0, 2, 4, 6, 8))
        sim.set_quota(external_usage=external)
        sim.advance(rng.uniform(10, 40))
        result = tick()
        assert result["status"] == "ok", result
        if result["admitted"]:
            admitted_total += len(result["admitted"])
            assert _ours(conn) + external <= limit, (step, external, result)
        if lag == 0:
            usage = result["quota"]["usage"]
            assert result["ours_recent"] == 0, (step, result)
            assert result["budget"] == limit - max(usage, result["ours_total"]), (step, result)
    assert admitted_total >= 15  # the run did admit, so the checks above had work to do


def test_every_phase_runs_as_the_scheduler_role(
        conn: Conn, sim: RecordingSimulator, db_url: str, provider: FireworksClient,
        settings: Settings) -> None:
    """In production the tick connects as a login role that is only a member of
    sftq_scheduler: each procedure a phase calls must be granted to it. A tick here runs as
    that role through admission, a failed create, its held retry, the retry that lands,
    reconcile, a cancel and the second quota reading."""
    role_db = Database(psycopg.conninfo.make_conninfo(db_url, options="-c role=sftq_scheduler"),
                       max_size=2, timeout=5.0)
    try:
        def tick() -> dict[str, Any]:
            result = run_tick(role_db, provider, settings, holder="role-test")
            assert not [e for e in result["errors"] if "permission denied" in e], result
            return result

        sim.set_quota(max_value=8, usage_lag_seconds=0)
        first = enqueue(conn, create_user(conn, "alice"))
        second = enqueue(conn, create_user(conn, "bob"))
        sim.set_faults(rules=[{"method": "POST", "path": r"/supervisedFineTuningJobs$",
                               "status": 503, "times": 2}])
        assert tick()["admitted"] == [str(first), str(second)]
        sim.set_quota(external_usage=4)
        assert tick()["creates_held"] == 1  # alice's is created, bob's waits for room
        sim.set_quota(external_usage=0)
        assert tick()["submitted"] == 1 and job(conn, second)["submitted_at"] is not None
        # Recorded, its provider stop left to the tick (as when the API's own stop fails).
        assert conn.execute("SELECT action FROM sftq.cancel(%s, %s)",
                            (job(conn, first)["user_id"], first)).fetchone() == ("provider_delete",)
        sim.finish("SFT", pid(second), "JOB_STATE_COMPLETED")
        result = tick()
        assert (state(conn, first), state(conn, second)) == ("CANCELLED", "SUCCESS")
        assert result["status"] == "ok", result
    finally:
        role_db.close()
