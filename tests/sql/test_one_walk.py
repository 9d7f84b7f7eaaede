"""One admission walk: the forecast's first simulated walk admits exactly what the next tick
admits, on randomized queues (users with caps 0-3, some disabled, some already running, jobs of
1-8 GPUs, any budget). The forecast (sftq.forecast) and admission (sftq._admit) both decide
each walk with sftq._walk_admits, so a change to the rule changes both."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg

from .conftest import Q, t

TICK = timedelta(seconds=30)
GRACE = timedelta(minutes=5)
CASES = 40


def _random_queue(q: Q, rng: random.Random) -> None:
    users = [q.user(f"u{i}", cap=rng.choice([0, 1, 1, 1, 2, 3]))
             for i in range(rng.randint(1, 9))]
    # Jobs already running (admitted a minute before the tick, so that none is expected to end
    # by it): one admission per user per walk, so a few walks at a budget that fits them.
    for i in range(rng.randint(0, 12)):
        q.enqueue(rng.choice(users), gpus=rng.randint(1, 8), at=t(i))
    for step in range(rng.randint(0, 3)):
        q.admit(rng.randint(0, 16), at=t(100 + step))
    for i in range(rng.randint(0, 40)):
        q.enqueue(rng.choice(users), kind=rng.choice(["SFT", "DPO", "RFT"]),
                  gpus=rng.randint(1, 8), at=t(200 + i))
    # Some users disabled after they enqueued (a disabled user cannot enqueue).
    for i in range(len(users)):
        if rng.random() < 0.15:
            q.one("SELECT sftq.set_user_disabled(%s, true, %s)", f"u{i}", t(300))


def _forecast_first_walk(q: Q, budget: int) -> set[UUID]:
    """The jobs the forecast starts at its first walk (the next tick after the last one)."""
    rows = q.all(
        """WITH head AS (SELECT j.id, j.kind, j.gpu_count,
                                row_number() OVER (ORDER BY j.created_at, j.id) - 1 AS ahead
                           FROM sftq.jobs j WHERE j.state = 'QUEUED')
           SELECT f.job_id, f.estimated_start_at
             FROM sftq.forecast(NULL,
                      (SELECT array_agg(id ORDER BY ahead) FROM head),
                      (SELECT array_agg(ahead ORDER BY ahead) FROM head),
                      (SELECT array_agg(kind ORDER BY ahead) FROM head),
                      (SELECT array_agg(gpu_count ORDER BY ahead) FROM head),
                      %s, %s, %s, %s) f""",
        t(400), budget, t(390), TICK)
    return {UUID(str(r[0])) for r in rows if r[1] == t(420)}


def test_the_forecasts_first_walk_is_the_next_ticks_admission(
        conn: psycopg.Connection[Any]) -> None:
    q = Q(conn)
    compared = 0
    for seed in range(CASES):
        rng = random.Random(seed)
        with conn.transaction(force_rollback=True):
            _random_queue(q, rng)
            budget = rng.randint(0, 24)
            forecast = _forecast_first_walk(q, budget)
            admitted = {UUID(str(r[0])) for r in q.all(
                "SELECT job_id FROM sftq.admit(%s, %s)", budget, t(420))}
            assert forecast == admitted, (seed, budget, forecast ^ admitted)
            compared += bool(admitted)
    # The cases admit something often enough to mean something.
    assert compared >= CASES // 2
