"""sftq._user_limit_one (a lone POST /jobs) answers exactly what sftq.user_limits_take does for
a batch of one, whatever the user's rate, bucket, queue and limit."""

from __future__ import annotations

import random
from typing import Any

import psycopg

NOW = "2026-12-08 12:00:00+00"


def _answer(conn: psycopg.Connection[Any], fn: str, uid: int | None) -> tuple[Any, ...]:
    with conn.transaction(force_rollback=True):
        arg = "ARRAY[%s::bigint]" if fn == "sftq.user_limits_take" else "%s::bigint"
        row = conn.execute(
            f"SELECT l.user_ids, l.err_states, l.err_messages, l.err_details, "
            f"(SELECT (b.tat, b.granted)::text FROM sftq.user_rate b WHERE b.user_id = %s), "
            f"current_setting('sftq.queue_limited', true) "
            f"FROM {fn}({arg}, true, %s::timestamptz) l", (uid, uid, NOW)).fetchone()
        assert row is not None
        # NULL and an array of NULLs mean the same to the caller (COALESCE(err[1], ...)).
        return tuple(None if v == [None] else v for v in row)


def test_one_request_is_answered_as_a_batch_of_one(conn: psycopg.Connection[Any]) -> None:
    rng = random.Random(52)
    uid = conn.execute("SELECT sftq.create_user('limited', 1)").fetchone()[0]  # type: ignore[index]
    for _ in range(300):
        rate = rng.choice([None, 0, 1, 5, 60, 600])
        conn.execute("UPDATE sftq.user_limit_defaults SET rate_per_minute = %s, max_queued = %s",
                     (rng.choice([0, 600, 3]), rng.choice([0, 2, 5])))
        conn.execute("UPDATE sftq.users SET rate_per_minute = %s, max_queued = %s, "
                     "queued_count = %s WHERE id = %s",
                     (rate, rng.choice([None, 0, 1, 4]), rng.randint(0, 6), uid))
        conn.execute("UPDATE sftq.user_rate SET tat = %s::timestamptz + make_interval(secs => %s)"
                     " WHERE user_id = %s", (NOW, rng.uniform(-120, 70), uid))
        one = _answer(conn, "sftq._user_limit_one", uid)
        batch = _answer(conn, "sftq.user_limits_take", uid)
        assert one == batch, (rate, one, batch)
    assert _answer(conn, "sftq._user_limit_one", None)[1:4] == (None, None, None)
