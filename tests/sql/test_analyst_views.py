"""sftq.analyst_queue and sftq.analyst_daily answer exactly what their first definitions
answered (kept below as reference queries), through random histories of enqueues,
admissions, finishes, cancels and ticks across several days, in several time zones: with
days rolled up (sql/procedures/160_analyst_daily.sql), with jobs that change state after
their day was rolled up, before and after the tick folds those moves in."""

from __future__ import annotations

import random
import threading
import time
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest

from .conftest import T0, Q

# The views as first written (sql/views/010_analyst.sql before the rollup).
OLD_DAILY = """
SELECT date_trunc('day', j.created_at) AS day, j.kind, j.state, count(*) AS jobs,
       sum(j.gpu_count * extract(epoch FROM j.completed_at - j.started_at) / 3600) AS gpu_hours
  FROM sftq.jobs j
 GROUP BY 1, 2, 3
"""
OLD_QUEUE = """
SELECT row_number() OVER (ORDER BY j.created_at, j.id) AS fifo_rank,
       j.id, u.name AS user_name, j.kind, j.gpu_count, j.created_at,
       j.id = u.head_job_id AS is_user_head,
       u.running_count >= u.max_running AS user_at_cap
  FROM sftq.jobs j
  JOIN sftq.users u ON u.id = j.user_id
 WHERE j.state = 'QUEUED'
"""

# UTC; whole hours off it (with and without summer time); 30 and 45 minutes off a whole hour.
ZONES = ("UTC", "America/New_York", "Europe/London", "Asia/Kolkata", "Asia/Kathmandu")

START = T0 - timedelta(days=6)


def _text_rows(q: Q, sql: str, *params: Any) -> list[tuple[str | None, ...]]:
    """Rows as the server prints them, so that a numeric's scale counts too."""
    return [
        tuple(None if v is None else str(v) for v in row)
        for row in q.all(f"SELECT t.*::text FROM ({sql}) t", *params)
    ]


def assert_daily_matches(q: Q) -> None:
    since = START + timedelta(days=1)
    until = START + timedelta(days=4)
    try:
        for zone in ZONES:
            q.conn.execute(f"SET TIME ZONE '{zone}'")
            new = _text_rows(q, "SELECT * FROM sftq.analyst_daily ORDER BY day, kind, state")
            old = _text_rows(q, f"SELECT * FROM ({OLD_DAILY}) o ORDER BY day, kind, state")
            assert new == old, zone
            # A range of days, as analysts ask (the filter goes down into every part).
            ranged = "SELECT * FROM {} WHERE day >= %s AND day < %s ORDER BY day, kind, state"
            new = _text_rows(q, ranged.format("sftq.analyst_daily"), since, until)
            old = _text_rows(q, ranged.format(f"({OLD_DAILY}) o"), since, until)
            assert new == old, zone
    finally:
        q.conn.execute("SET TIME ZONE 'UTC'")


def assert_queue_matches(q: Q) -> None:
    for shape in (
        "SELECT * FROM {} ORDER BY fifo_rank",
        "SELECT * FROM {} ORDER BY fifo_rank LIMIT 7",
        "SELECT * FROM {} WHERE fifo_rank <= 7 ORDER BY fifo_rank",
        "SELECT * FROM {} ORDER BY created_at, id LIMIT 7",
        "SELECT * FROM {} WHERE user_name = 'u1' ORDER BY fifo_rank",
        "SELECT * FROM {} WHERE is_user_head AND NOT user_at_cap ORDER BY fifo_rank",
    ):
        new = _text_rows(q, shape.format("sftq.analyst_queue"))
        old = _text_rows(q, shape.format(f"({OLD_QUEUE}) o"))
        assert new == old, shape


def tick(q: Q, at: datetime) -> None:
    tick_id = q.one("SELECT sftq.tick_begin('test', interval '2 minutes', %s)", at)
    assert tick_id is not None
    q.one("SELECT sftq.tick_finish(%s, '{}'::jsonb, %s)::text", tick_id, at)
    assert q.one("SELECT status FROM sftq.scheduler_ticks WHERE id = %s", tick_id) == "ok"


def rollup_state(q: Q) -> tuple[datetime | None, datetime | None, datetime | None]:
    """moves_before, rolled_from, rolled_through (None for -infinity: nothing yet)."""
    row = q.conn.execute(
        "SELECT nullif(moves_before, '-infinity'), rolled_from, nullif(rolled_through, '-infinity')"
        "  FROM sftq.daily_rollup_state"
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def pending_moves(q: Q) -> int:
    """Moves of rolled-up days that the tick has not folded in yet."""
    return int(
        q.one(
            "SELECT count(*) FROM sftq.daily_rollup_moves m, sftq.daily_rollup_state s "
            "WHERE m.hour < s.rolled_through"
        )
    )


class History:
    """A random mix of what happens to a queue, on a clock that only moves forward."""

    def __init__(self, q: Q, seed: int) -> None:
        self.q = q
        self.rng = random.Random(seed)
        self.now = START
        self.users = [q.user(f"u{i}", cap=1 + i % 2) for i in range(4)]
        self.queued: dict[UUID, int] = {}
        self.running: list[UUID] = []
        self.cancelling: list[UUID] = []

    def step(self) -> str:
        rng, q = self.rng, self.q
        # Minutes to hours apart, so that jobs fall near every zone's midnights.
        self.now += timedelta(minutes=rng.choice([1, 7, 29, 45, 90, 180, 330]))
        what = rng.choices(
            ["enqueue", "admit", "finish", "cancel", "cancel_running", "tick"],
            weights=[6, 3, 3, 2, 1, 3],
        )[0]
        if what == "enqueue":
            for _ in range(rng.randint(1, 3)):
                user = rng.choice(self.users)
                job = q.enqueue(
                    user, rng.choice(["SFT", "DPO", "RFT"]), rng.choice([1, 2, 4, 8]), at=self.now
                )
                self.queued[job] = user
        elif what == "admit":
            for job in q.admit(rng.choice([4, 8, 16]), self.now):
                self.queued.pop(job)
                self.running.append(job)
        elif what == "finish" and self.running:
            job = self.running.pop(rng.randrange(len(self.running)))
            q.submitted(job, at=self.now)
            end = self.now + timedelta(
                minutes=rng.randint(1, 600), microseconds=rng.randint(0, 999)
            )
            state = rng.choice(["JOB_STATE_COMPLETED", "JOB_STATE_COMPLETED", "JOB_STATE_FAILED"])
            q.provider_state(job, state, "boom" if state.endswith("FAILED") else None, at=end)
        elif what == "cancel" and self.queued:
            job = rng.choice(sorted(self.queued))
            q.all(
                "SELECT * FROM sftq.cancel(%s, %s, NULL, %s)", self.queued.pop(job), job, self.now
            )
        elif what == "cancel_running" and self.running:
            job = self.running.pop(rng.randrange(len(self.running)))
            q.all(
                "SELECT * FROM sftq.cancel(%s, %s, NULL, %s)", q.job(job)["user_id"], job, self.now
            )
            q.one("SELECT sftq.complete_cancel(%s, 'scheduler', NULL, %s)", job, self.now)
        elif what == "tick":
            tick(q, self.now)
        return what


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_views_answer_as_their_first_definitions_through_random_histories(q: Q, seed: int) -> None:
    h = History(q, seed)
    seen_pending = seen_folded = 0
    for i in range(160):
        before = pending_moves(q)
        what = h.step()
        if what == "tick" or i % 4 == 0:
            assert_daily_matches(q)
            assert_queue_matches(q)
            pending = pending_moves(q)
            seen_pending += pending > 0
            seen_folded += what == "tick" and before > 0 and pending == 0
    # The history did what the test is about: days were rolled up, jobs of rolled-up days
    # changed state and were read before and after the tick folded their moves in.
    _, rolled_from, rolled_through = rollup_state(q)
    assert rolled_from is not None and rolled_through is not None
    assert rolled_through - rolled_from >= timedelta(days=3)
    assert seen_pending and seen_folded, (seen_pending, seen_folded)
    assert q.one("SELECT count(*) FROM sftq.daily_rollup") > 0


def test_a_job_that_moves_after_its_day_was_rolled_up(q: Q) -> None:
    day1 = START.replace(hour=0, minute=0, second=0, microsecond=0)
    day2 = day1 + timedelta(days=1)
    a, b = q.user("a"), q.user("b")
    job_a = q.enqueue(a, "SFT", 4, at=day1 + timedelta(hours=10))
    job_b = q.enqueue(b, "DPO", 2, at=day1 + timedelta(hours=11))

    # The first tick of day 2 moves the log's horizon on; the next one rolls day 1 up.
    tick(q, day2 + timedelta(minutes=10))
    assert rollup_state(q) == (day2, None, None)
    tick(q, day2 + timedelta(minutes=20))
    assert rollup_state(q) == (day2, day1, day2)
    rolled = "SELECT kind, state, jobs FROM sftq.daily_rollup WHERE day = %s ORDER BY kind"
    assert q.all(rolled, day1) == [("DPO", "QUEUED", 1), ("SFT", "QUEUED", 1)]

    # Admitted on day 2: the rollup still says queued, the view does not.
    assert q.admit(8, day2 + timedelta(hours=1)) == [job_a, job_b]
    assert pending_moves(q) == 2
    assert_daily_matches(q)
    tick(q, day2 + timedelta(hours=1, minutes=1))
    assert pending_moves(q) == 0
    assert q.all(rolled, day1) == [("DPO", "PROGRESS", 1), ("SFT", "PROGRESS", 1)]
    assert_daily_matches(q)

    # Finished: GPU hours appear; a group whose jobs all left disappears.
    q.submitted(job_a, at=day2 + timedelta(hours=2))
    q.provider_state(job_a, "JOB_STATE_COMPLETED", at=day2 + timedelta(hours=3, seconds=1))
    q.all("SELECT * FROM sftq.cancel(%s, %s, NULL, %s)", b, job_b, day2 + timedelta(hours=3))
    q.one(
        "SELECT sftq.complete_cancel(%s, 'scheduler', NULL, %s)", job_b, day2 + timedelta(hours=3)
    )
    assert_daily_matches(q)
    tick(q, day2 + timedelta(hours=4))
    assert q.all(rolled, day1) == [("DPO", "CANCELLED", 1), ("SFT", "SUCCESS", 1)]
    assert q.one("SELECT gpu_hours FROM sftq.analyst_daily WHERE state = 'SUCCESS'") == q.one(
        "SELECT gpu_hours FROM sftq.analyst_jobs WHERE id = %s", job_a
    )
    assert_daily_matches(q)


def test_rebuild_counts_rows_loaded_by_hand(q: Q) -> None:
    a = q.user("a")
    q.enqueue(a, at=START)
    tick(q, START + timedelta(days=2))
    tick(q, START + timedelta(days=2, minutes=1))
    # Rows put straight into sftq.jobs (as bench/dataset.py loads them) bypass the log.
    q.conn.execute(
        "INSERT INTO sftq.jobs (user_id, kind, state, fireworks_payload, created_at, started_at,"
        " completed_at) VALUES (%s, 'RFT', 'SUCCESS', '{}', %s, %s, %s)",
        (a, START, START + timedelta(minutes=5), START + timedelta(hours=2)),
    )
    q.one("SELECT sftq.daily_rollup_rebuild(%s)::text", START + timedelta(days=2, minutes=2))
    assert rollup_state(q)[2] == (START + timedelta(days=2)).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    assert_daily_matches(q)


def test_a_busy_gate_delays_the_rollup_and_never_the_tick(db_url: str, q: Q) -> None:
    a = q.user("a")
    q.enqueue(a, at=START)
    day = START.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    with psycopg.connect(db_url, autocommit=True) as other:
        # An enqueue in flight holds the shared gate (and may get a created_at before midnight).
        other.execute("BEGIN")
        other.execute("SELECT sftq._gate()")
        started = time.monotonic()
        tick(q, day + timedelta(minutes=1))
        assert time.monotonic() - started < 5
        assert rollup_state(q)[0] is None
        other.execute("COMMIT")
    tick(q, day + timedelta(minutes=2))
    assert rollup_state(q)[0] == day


def test_a_failing_refresh_warns_and_the_tick_still_ends(q: Q) -> None:
    a = q.user("a")
    q.enqueue(a, at=START)
    day = START.replace(hour=0, minute=0, second=0, microsecond=0)
    tick(q, day + timedelta(days=1, minutes=1))
    tick(q, day + timedelta(days=1, minutes=2))
    assert q.admit(8, day + timedelta(days=1, minutes=3))
    # Whatever the refresh trips over (here: a rollup that takes no more rows).
    q.conn.execute("ALTER TABLE sftq.daily_rollup ADD CONSTRAINT broken CHECK (false) NOT VALID")
    notices: list[str] = []
    q.conn.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
    tick(q, day + timedelta(days=1, minutes=4))
    assert any("analyst_daily: rollup not refreshed" in n for n in notices), notices
    assert pending_moves(q) == 1  # nothing was half done: the move waits for the next tick
    assert_daily_matches(q)


def test_transitions_log_only_the_moves_of_rolled_up_days(q: Q) -> None:
    a, b = q.user("a"), q.user("b")
    old = q.enqueue(a, at=START)
    tick(q, START + timedelta(days=1))
    new = q.enqueue(b, at=START + timedelta(days=1, minutes=1))
    assert q.admit(16, START + timedelta(days=1, minutes=2)) == [old, new]
    assert q.all("SELECT kind, from_state, to_state FROM sftq.daily_rollup_moves") == [
        ("SFT", "QUEUED", "PROGRESS")
    ]
    assert_daily_matches(q)


def test_concurrent_cancels_while_the_tick_folds_stay_exact(db_url: str, q: Q) -> None:
    users = [q.user(f"u{i}") for i in range(6)]
    jobs = {q.enqueue(u, at=START + timedelta(minutes=i)): u for i, u in enumerate(users * 5)}
    day = START.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    tick(q, day)
    tick(q, day + timedelta(minutes=1))
    errors: list[BaseException] = []

    def canceller(items: list[tuple[UUID, int]]) -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as c:
                for job, user in items:
                    c.execute("SELECT * FROM sftq.cancel(%s, %s, NULL, %s)", (user, job, day))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    items = sorted(jobs.items())
    threads = [threading.Thread(target=canceller, args=(items[i::3],)) for i in range(3)]
    for t in threads:
        t.start()
    for i in range(20):
        tick(q, day + timedelta(minutes=2 + i))
    for t in threads:
        t.join()
    assert not errors, errors
    assert_daily_matches(q)
    tick(q, day + timedelta(hours=1))
    assert pending_moves(q) == 0
    assert_daily_matches(q)
