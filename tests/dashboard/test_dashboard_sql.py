"""The dashboard's procedures (sql/procedures/150_dashboard.sql): the anonymised queue built on the
admission walk and the forecast, the redacted payload, and the bounded chart series."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from dash_support import GRACE, PAYLOAD, SECRETS, TICK, Q, t


@pytest.fixture
def q(conn: psycopg.Connection[Any]) -> Iterator[Q]:
    yield Q(conn)


def queue(q: Q, user: int, now: datetime, limit: int = 50) -> dict[str, Any]:
    body: dict[str, Any] = q.one("SELECT sftq.public_queue(%s, %s, %s, %s, %s)",
                                 user, limit, now, TICK, GRACE)
    return body


def own_view(q: Q, user: int, now: datetime) -> dict[UUID, dict[str, Any]]:
    """What the owner sees of their queued jobs (GET /jobs/analytics/queue, sftq.queue_view)."""
    cur = q.conn.execute("SELECT * FROM sftq.queue_view(%s, %s, %s, %s)", (user, now, TICK, GRACE))
    assert cur.description is not None
    names = [d.name for d in cur.description]
    return {UUID(str(r[0])): dict(zip(names, r, strict=True)) for r in cur.fetchall()}


def iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.fixture
def world(q: Q) -> dict[str, Any]:
    """Quota 16; a's 4-GPU job runs (12 free). FIFO: a1 a2 b1 c1 d1 e1 (e disabled):
    every reason code but scheduler_stalled."""
    users = {n: q.user(f"dash-user-{n}") for n in "abcde"}
    ra = q.enqueue(users["a"], at=t(0), name="running one")
    assert q.admit(16, at=t(1)) == [ra]
    q.submitted(ra, at=t(1))
    jobs = {
        "a1": q.enqueue(users["a"], gpus=4, at=t(2), name="a-first", payload=PAYLOAD),
        "a2": q.enqueue(users["a"], gpus=4, at=t(3), name="a-second"),
        "b1": q.enqueue(users["b"], gpus=4, at=t(4), name="secret-name-b1", payload=PAYLOAD),
        "c1": q.enqueue(users["c"], gpus=16, at=t(5), name="secret-name-c1"),
        "d1": q.enqueue(users["d"], gpus=2, at=t(6), name="secret-name-d1"),
        "e1": q.enqueue(users["e"], gpus=4, at=t(7), name="secret-name-e1"),
    }
    q.one("SELECT sftq.set_user_disabled('dash-user-e', true)")
    q.tick(t(10))
    return {"users": users, "jobs": jobs}


def test_queue_is_fifo_anonymised_and_agrees_with_each_owners_view(
        q: Q, world: dict[str, Any]) -> None:
    users, jobs = world["users"], world["jobs"]
    now = t(20)
    body = queue(q, users["b"], now)
    items = body["items"]
    assert [i["position"] for i in items] == [1, 2, 3, 4, 5, 6]
    assert body["depth"] == 6 and body["has_more"] is False and body["your_queued_jobs"] == 1
    order = ["a1", "a2", "b1", "c1", "d1", "e1"]
    # Only the caller's job carries its id and name.
    assert [i["mine"] for i in items] == [n == "b1" for n in order]
    assert items[2]["id"] == str(jobs["b1"]) and items[2]["display_name"] == "secret-name-b1"
    for i in items:
        if not i["mine"]:
            assert i["id"] is None and i["display_name"] is None
        assert set(i) == {"position", "mine", "id", "display_name", "kind", "gpu_count",
                          "created_at", "waiting_reason", "estimated_start_at", "estimate"}
    # Reason codes and estimates are each owner's own (the same walk and forecast).
    owner = {"a1": "a", "a2": "a", "b1": "b", "c1": "c", "d1": "d", "e1": "e"}
    for item, name in zip(items, order, strict=True):
        theirs = own_view(q, users[owner[name]], now)[jobs[name]]
        assert item["waiting_reason"]["code"] == theirs["waiting_code"], name
        assert item["estimated_start_at"] == iso(theirs["estimated_start_at"]), name
        assert item["kind"] == "SFT" and item["gpu_count"] in (2, 4, 16)
    codes = [i["waiting_reason"]["code"] for i in items]
    assert codes == ["behind_own_running_job", "behind_own_queued_job", "next_tick",
                     "does_not_fit", "behind_job_that_does_not_fit", "user_disabled"]
    # My own job reads exactly as in my own view; the others in the third person.
    mine = own_view(q, users["b"], now)[jobs["b1"]]
    assert items[2]["waiting_reason"]["message"] == mine["waiting_message"]
    assert items[2]["estimate"]["basis"] == mine["estimate_basis"]
    assert items[0]["waiting_reason"]["message"] == (
        "Its submitter is at their cap on running jobs: it is admitted when one of theirs ends.")
    assert items[1]["waiting_reason"]["message"] == (
        "Behind 1 earlier queued job of the same submitter, which start first.")
    assert items[5]["waiting_reason"]["message"].startswith("Its submitter's account is disabled")
    assert items[5]["estimate"]["basis"] == "no estimate: its submitter's account is disabled"
    # Other users' enqueue times only to the second.
    assert items[0]["created_at"] == "2026-05-01T10:00:02.000000Z"


def test_queue_never_shows_another_users_name_id_or_payload(q: Q, world: dict[str, Any]) -> None:
    users, jobs = world["users"], world["jobs"]
    text = json.dumps(queue(q, users["c"], t(20)))
    for name in "abde":
        assert f"dash-user-{name}" not in text
    for label, job in jobs.items():
        if label != "c1":
            assert str(job) not in text and f"secret-name-{label}" not in text
    for secret in (*SECRETS, "dataset", "baseModel", "wandb", "accounts/"):
        assert secret not in text
    # No sentence for another user's job speaks to the reader as its owner.
    for item in json.loads(text)["items"]:
        if not item["mine"]:
            words = (item["waiting_reason"]["message"] + " " + item["estimate"]["basis"]).lower()
            assert " your " not in f" {words} " and "you " not in words, item


def test_queue_limit_depth_and_stalled_scheduler(q: Q, world: dict[str, Any]) -> None:
    users = world["users"]
    body = queue(q, users["d"], t(20), limit=2)
    assert [i["position"] for i in body["items"]] == [1, 2]
    assert body["has_more"] is True and body["depth"] == 6 and body["limit"] == 2
    assert body["your_queued_jobs"] == 1
    # A user with nothing queued still sees the queue.
    idle = q.user("dash-idle")
    assert queue(q, idle, t(20))["your_queued_jobs"] == 0
    # No tick for more than 3 intervals: every job says so, and none has an estimate.
    late = queue(q, idle, t(300))
    for item in late["items"]:
        if item["waiting_reason"]["code"] != "user_disabled":
            assert item["waiting_reason"]["code"] == "scheduler_stalled"
        assert item["estimated_start_at"] is None
        assert item["estimate"]["basis"].startswith("no estimate")
    # An empty queue.
    empty_db_user = q.user("dash-empty")
    for job in q.all("SELECT id, user_id FROM sftq.jobs WHERE state = 'QUEUED'"):
        q.cancel(job[1], job[0])
    assert queue(q, empty_db_user, t(20)) == {"depth": 0, "limit": 50, "has_more": False,
                                              "your_queued_jobs": 0, "items": []}


def test_api_queue_checks_key_and_limit(q: Q) -> None:
    q.user("dash-api")
    key = q.key("dash-api")
    import hashlib

    digest = hashlib.sha256(key.encode()).digest()
    assert q.one("SELECT sftq.api_public_queue(%s, 10, %s, %s)", digest, TICK, GRACE)["items"] == []
    for bad in (0, 101):
        with pytest.raises(psycopg.Error) as exc:
            q.one("SELECT sftq.api_public_queue(%s, %s, %s, %s)", digest, bad, TICK, GRACE)
        assert exc.value.sqlstate == "SQ400"
    with pytest.raises(psycopg.Error) as exc:
        q.one("SELECT sftq.api_public_queue(%s, 10, %s, %s)", b"\0" * 32, TICK, GRACE)
    assert exc.value.sqlstate == "SQ401"


def test_payload_is_redacted_and_owner_scoped(q: Q) -> None:
    import hashlib

    a, b = q.user("dash-pa"), q.user("dash-pb")
    ka, kb = (hashlib.sha256(q.key(n).encode()).digest() for n in ("dash-pa", "dash-pb"))
    job = q.enqueue(a, payload=PAYLOAD)
    body = q.one("SELECT sftq.api_job_payload(%s, %s)", ka, job)
    assert body["id"] == str(job)
    payload = body["fireworks_payload"]
    assert payload["wandbConfig"] == {"apiKey": "[REDACTED]", "project": "dash"}
    assert payload["awsS3Config"] == {"credentialsSecret": "[REDACTED]"}
    assert payload["dataset"] == PAYLOAD["dataset"] and payload["epochs"] == 2
    for secret in SECRETS:
        assert secret not in json.dumps(body)
    with pytest.raises(psycopg.Error) as exc:
        q.one("SELECT sftq.api_job_payload(%s, %s)", kb, job)
    assert exc.value.sqlstate == "SQ404"
    assert b  # b exists and has a valid key: the 404 is ownership, not authentication


def test_history_buckets_waits_runs_and_kinds(q: Q) -> None:
    a, other = q.user("dash-hist", cap=10), q.user("dash-hist-other", cap=10)
    now = t(3 * 86400 - 60)
    # Day 0: two SFT jobs waited 60 s and 120 s, ran 600 s and 1200 s (one fails).
    # Day 1: one DPO job cancelled while queued. Day 2: one RFT job still queued.
    j1 = q.enqueue(a, "SFT", at=t(0))
    j2 = q.enqueue(a, "SFT", at=t(10))
    assert q.admit(100, at=t(60)) == [j1]
    assert q.admit(100, at=t(130)) == [j2]
    for job, at in ((j1, 61), (j2, 131)):
        q.submitted(job, at=t(at))
    q.finish(j1, "JOB_STATE_COMPLETED", t(660))
    q.finish(j2, "JOB_STATE_FAILED", t(1330))
    j3 = q.enqueue(a, "DPO", at=t(86400 + 5))
    q.cancel(a, j3)
    q.enqueue(a, "RFT", at=t(2 * 86400 + 5))
    q.enqueue(other, "SFT", at=t(20))  # never counted for a
    body = q.one("SELECT sftq.job_history(%s, 3, %s)", a, now)
    assert body["days"] == 3 and body["bucket_seconds"] == 86400
    assert body["jobs"] == 4 and body["truncated"] is False
    buckets = body["buckets"]
    assert len(buckets) == 4  # the window's first partial day through today
    by_start = {b["start"]: b for b in buckets}
    day0 = by_start["2026-05-01T00:00:00.000000Z"]
    assert (day0["jobs"], day0["started"], day0["finished"]) == (2, 2, 2)
    assert day0["wait_p50_seconds"] == 90.0 and day0["run_p50_seconds"] == 900.0
    assert day0["wait_p90_seconds"] == 114.0 and day0["run_p90_seconds"] == 1140.0
    day1 = by_start["2026-05-02T00:00:00.000000Z"]
    assert (day1["jobs"], day1["started"], day1["wait_p50_seconds"]) == (1, 0, None)
    kinds = {k["kind"]: k for k in body["by_kind"]}
    assert list(kinds) == ["SFT", "DPO", "RFT"]
    assert kinds["SFT"] | {} == {"kind": "SFT", "succeeded": 1, "failed": 1, "cancelled": 0,
                                 "open": 0, "success_rate": 0.5}
    assert kinds["DPO"]["success_rate"] == 0.0 and kinds["RFT"]["success_rate"] is None
    assert kinds["RFT"]["open"] == 1
    # A day or two: hourly buckets.
    short = q.one("SELECT sftq.job_history(%s, 1, %s)", a, t(3600 * 5))
    assert short["bucket_seconds"] == 3600 and len(short["buckets"]) in (24, 25)
    assert sum(b["jobs"] for b in short["buckets"]) == 2


def test_history_reads_at_most_max_jobs(q: Q) -> None:
    a = q.user("dash-many")
    q.conn.execute(
        "SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb, NULL, 1, NULL, %s + s * interval '1 second')"
        "  FROM generate_series(1, 30) s", (a, t(0)))
    body = q.one("SELECT sftq.job_history(%s, 2, %s, 10)", a, t(100))
    assert body["jobs"] == 10 and body["truncated"] is True
    assert sum(b["jobs"] for b in body["buckets"]) == 10


def test_history_days_are_checked(q: Q) -> None:
    import hashlib

    q.user("dash-days")
    digest = hashlib.sha256(q.key("dash-days").encode()).digest()
    assert q.one("SELECT sftq.api_job_history(%s, 90)", digest)["days"] == 90
    for bad in (0, 91):
        with pytest.raises(psycopg.Error) as exc:
            q.one("SELECT sftq.api_job_history(%s, %s)", digest, bad)
        assert exc.value.sqlstate == "SQ400"


def test_gpu_history_samples_ticks(q: Q) -> None:
    now = t(86400)
    # Ticks in the last hour every 10 minutes; one tick that could not read the quota.
    for minutes in range(0, 60, 10):
        q.tick(now - timedelta(minutes=minutes, seconds=5), limit=16, usage=minutes / 10,
               ours=minutes // 10)
    q.tick(now - timedelta(minutes=90), limit=None)
    body = q.one("SELECT sftq.gpu_history(interval '24 hours', interval '15 minutes', %s)", now)
    assert body["window_seconds"] == 86400 and body["step_seconds"] == 900
    points = body["points"]
    assert len(points) == 96
    assert points[-1]["at"] == iso(now)
    # Each point is the newest tick in its 15 minutes: (now-15m, now] holds the 0 and 10
    # minute ticks, so the 0 minute one.
    assert (points[-1]["quota_limit"], points[-1]["quota_usage"], points[-1]["queue_gpus"]) == (
        16, 0, 0)
    assert points[-2]["quota_usage"] == 2 and points[-2]["queue_gpus"] == 2
    assert points[-5]["quota_limit"] is None  # 60-75 minutes ago: no tick that read the quota
    assert all(p["quota_limit"] is None for p in points[:-4])
    week = q.one("SELECT sftq.gpu_history(interval '7 days', interval '1 hour', %s)", now)
    assert len(week["points"]) == 168 and week["points"][-1]["quota_limit"] == 16


def test_a_mixed_queue_gets_each_owners_estimates_from_one_simulation(q: Q) -> None:
    """20 users, 3 jobs each, interleaved, 4 running: the list's estimates come from one
    simulation for everyone (plus one for the caller) and still agree with what each owner
    sees in their own view."""
    users = [q.user(f"mix-{i}") for i in range(20)]
    running = [q.enqueue(users[i], gpus=4, at=t(i)) for i in range(4)]
    assert sorted(q.admit(16, at=t(30))) == sorted(running)
    for job in running:
        q.submitted(job, at=t(30))
    for k in range(3):
        for i, user in enumerate(users):
            q.enqueue(user, gpus=(2, 4, 8)[(i + k) % 3], at=t(40 + k * 20 + i))
    q.tick(t(100))
    now = t(110)
    body = queue(q, users[7], now, limit=60)
    assert len(body["items"]) == 60
    views = {}
    for user in users:
        views |= {str(job): v for job, v in own_view(q, user, now).items()}
    mine = {str(j) for j in own_view(q, users[7], now)}
    placed = 0
    for item in body["items"]:
        # Other users' ids are hidden: find the job by its position among the queued jobs.
        job = q.one("SELECT id FROM sftq.jobs WHERE state = 'QUEUED' "
                    "ORDER BY created_at, id OFFSET %s LIMIT 1", item["position"] - 1)
        theirs = views[str(job)]
        assert item["mine"] == (str(job) in mine)
        if theirs["estimated_start_at"] is not None and "simulated" in theirs["estimate_basis"]:
            assert item["estimated_start_at"] == iso(theirs["estimated_start_at"]), item
            placed += 1
    assert placed >= 20
