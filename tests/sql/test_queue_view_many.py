"""sftq.queue_view_many (the live stream's queue frames for every watched user at once): each
user gets exactly what sftq.queue_view answers for them alone (GET /jobs/analytics/queue),
whoever else is listed, and the cost of listing many users is one shared pass."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from .conftest import Q, t
from .test_waiting import GRACE, TICK, tick

COLUMNS = ("id, display_name, kind, gpu_count, created_at, queue_position, waiting_code, "
           "waiting_message, estimated_start_at, estimate_basis")


def alone(q: Q, user: int, now: Any) -> list[tuple[Any, ...]]:
    return q.all(f"SELECT {COLUMNS} FROM sftq.queue_view(%s, %s, %s, %s)", user, now, TICK, GRACE)


def together(q: Q, users: list[int], now: Any) -> dict[int, list[tuple[Any, ...]]]:
    rows = q.all(f"SELECT user_id, {COLUMNS} FROM sftq.queue_view_many(%s, %s, %s, %s)",
                 users, now, TICK, GRACE)
    out: dict[int, list[tuple[Any, ...]]] = {u: [] for u in users}
    for r in rows:
        out[r[0]].append(r[1:])
    return out


@pytest.mark.parametrize(("seed", "jobs"), [(1, 40), (2, 90), (3, 700)])
def test_each_user_gets_what_it_gets_alone(q: Q, seed: int, jobs: int) -> None:
    rng = random.Random(seed)
    users = [q.user(f"u{i}", cap=rng.choice([1, 1, 2])) for i in range(8)]
    now = t(0)
    for i in range(jobs):
        q.enqueue(rng.choice(users), rng.choice(["SFT", "DPO", "RFT"]), rng.choice([1, 2, 4, 8]),
                  at=now - timedelta(seconds=jobs - i))
    q.admit(16, at=now - timedelta(seconds=1))  # some run: their ends drive the simulation
    q.conn.execute("SELECT sftq.set_user_disabled('u7', true)")
    tick(q, now - timedelta(seconds=5), limit=24, usage=10)
    # 700 jobs: past the forecast's window of 600, so some estimates are extrapolated.
    everyone = together(q, users, now)
    for u in users:
        assert everyone[u] == alone(q, u, now), u
    some = rng.sample(users, 3)
    subset = together(q, some, now)
    for u in some:
        assert subset[u] == everyone[u]
    if jobs > 600:
        bases = {r[-1].split(":")[0] for rows in everyone.values() for r in rows}
        assert "extrapolated" in bases and any(b.startswith("simulated") for b in bases)


def test_the_stream_refresh_uses_the_ticks_settings(q: Q) -> None:
    """Queue frames judge a stalled scheduler with the tick interval the tick recorded, as
    the API does with its own setting (issue 11: one source of truth)."""
    alice = q.user("alice")
    q.one("SELECT key FROM sftq.issue_key('alice')")
    job = q.enqueue(alice)
    q.conn.execute("INSERT INTO sftq.stream_watchers (instance, key_id, user_id, expires_at) "
                   "SELECT repeat('x', 16), k.id, k.user_id, now() + interval '1 hour' "
                   "FROM sftq.api_keys k WHERE k.user_id = %s", (alice,))
    tick(q, datetime.now(UTC) - timedelta(seconds=40), limit=24)

    def frame(interval: str) -> Any:
        q.all("SELECT sftq.stream_queue_refresh(now(), %s::interval, interval '5 minutes')",
              interval)
        return q.one("SELECT waiting_reason ->> 'code' FROM sftq.stream_queue_events "
                     "WHERE job_id = %s ORDER BY id DESC LIMIT 1", job)

    # The last tick 40 s ago: healthy at a 30 s interval, stalled at 5 s.
    assert frame("30 seconds") == "next_tick"
    assert frame("5 seconds") == "scheduler_stalled"


def test_one_forecast_for_every_listed_user(q: Q) -> None:
    """The work is shared: one forecast for all the listed users' jobs, not one per user.
    (Whether the planner keeps it out of a nested loop depends on its estimates; the stream
    bench's 100-users/1-user row is what caught that once, at 2,000 queued.)"""
    users = [q.user(f"u{i}") for i in range(100)]
    now = t(0)
    rows = [(users[i % 100], now - timedelta(seconds=200 - i)) for i in range(200)]
    q.conn.cursor().executemany("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb, NULL, 4, NULL, %s)",
                                rows)
    q.conn.execute("ANALYZE sftq.jobs, sftq.users")
    tick(q, now - timedelta(seconds=5), limit=24)
    with q.conn.transaction():
        q.conn.execute("SET LOCAL track_functions = 'pl'")
        q.all("SELECT * FROM sftq.queue_view_many(%s, %s, %s, %s)", users, now, TICK, GRACE)
        calls = dict(q.all("SELECT funcname, calls FROM pg_stat_xact_user_functions "
                           "WHERE schemaname = 'sftq' AND funcname IN ('forecast', 'queue_ahead')"))
    assert calls.get("forecast") == 1, calls
