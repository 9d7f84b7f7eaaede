"""Event-driven admission (issue 53, item 1): the wake flag set by the queue's own events
(sql/procedures/210_wake.sql), taken by the tick, polled by `sftq ticker`; and, through HTTP
on a live `sftq dev` stack with the ticker at its default 30 s, the latencies it buys."""

from __future__ import annotations

from typing import Any

import psycopg
from sched_support import cancel, create_user, enqueue, progress_ids

Conn = psycopg.Connection[Any]


def wake(conn: Conn) -> tuple[Any, ...]:
    row = conn.execute("SELECT requested_at, requested_by, requests, pokes "
                       "FROM sftq.admission_wake").fetchone()
    assert row is not None
    return tuple(row)


def take(conn: Conn) -> dict[str, Any]:
    row = conn.execute("SELECT sftq.admission_wake_take()").fetchone()
    assert row is not None
    return dict(row[0])


# ---- the flag, in SQL --------------------------------------------------------------------

def test_a_submit_sets_the_wake_once_per_transaction(conn: Conn) -> None:
    uid = create_user(conn, "ann", cap=1)
    assert wake(conn) == (None, None, 0, 0)
    with conn.transaction():
        for _ in range(20):
            enqueue(conn, uid)
        # Deferred to the commit: nothing is set while the transaction runs.
        assert wake(conn)[0] is None
    requested_at, by, requests, pokes = wake(conn)
    assert requested_at is not None and by == "submit" and (requests, pokes) == (1, 1)
    # Pending: more submits write nothing.
    enqueue(conn, uid)
    assert wake(conn)[2:] == (1, 1)
    taken = take(conn)
    assert taken["requested_by"] == "submit" and taken["waited_ms"] >= 0
    assert wake(conn)[0] is None and take(conn) == {}
    enqueue(conn, uid)
    assert wake(conn)[1:] == ("submit", 2, 2)


def test_a_rolled_back_submit_sets_nothing(conn: Conn) -> None:
    uid = create_user(conn, "ann")
    try:
        with conn.transaction():
            enqueue(conn, uid)
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    assert wake(conn) == (None, None, 0, 0)


def test_cancels_and_ends_set_the_wake(conn: Conn) -> None:
    uid = create_user(conn, "ann", cap=1)
    first = enqueue(conn, uid)
    second = enqueue(conn, uid)
    take(conn)
    conn.execute("SELECT sftq.admit(64)")
    assert progress_ids(conn) == {first}
    assert wake(conn)[0] is None  # admission itself is no event
    # Asking to cancel a running job: the tick finishes the stop, then admits.
    assert cancel(conn, uid, first) == "deferred"
    assert wake(conn)[1] == "cancel"
    take(conn)
    # A queued job cancelled: it may have been the head that held others back.
    assert cancel(conn, uid, second) == "none"
    assert wake(conn)[1] == "ended"
    take(conn)
    # The running job's stop confirmed: room freed.
    conn.execute("SELECT sftq.complete_cancel(%s)", (first,))
    assert wake(conn)[1] == "ended"


def test_a_tick_ending_with_a_wake_pending_pokes_again(conn: Conn) -> None:
    uid = create_user(conn, "ann")
    tick = conn.execute("SELECT sftq.tick_begin('t')").fetchone()
    assert tick is not None and tick[0] is not None
    enqueue(conn, uid)  # during the tick: the poke it sends finds the lease taken
    assert wake(conn)[3] == 1
    conn.execute("SELECT sftq.tick_finish(%s, '{}'::jsonb)", (tick[0],))
    assert wake(conn)[3] == 2  # re-poked when the lease came free
    take(conn)
    tick = conn.execute("SELECT sftq.tick_begin('t')").fetchone()
    assert tick is not None
    conn.execute("SELECT sftq.tick_finish(%s, '{}'::jsonb)", (tick[0],))
    assert wake(conn)[3] == 2  # nothing pending: no poke


def test_the_wake_state_a_ticker_polls(conn: Conn) -> None:
    uid = create_user(conn, "ann")
    row = conn.execute("SELECT * FROM sftq.admission_wake_state()").fetchone()
    assert row == (None, None, True, False)
    enqueue(conn, uid)
    tick = conn.execute("SELECT sftq.tick_begin('t')").fetchone()
    assert tick is not None
    row = conn.execute("SELECT * FROM sftq.admission_wake_state()").fetchone()
    assert row is not None
    assert 0 <= row[0] < 5 and 0 <= row[1] < 5 and row[2:] == (False, False)
    conn.execute("SELECT sftq.tick_finish(%s, '{}'::jsonb)", (tick[0],))
    assert conn.execute("SELECT lease_free FROM sftq.admission_wake_state()").fetchone() == (True,)
