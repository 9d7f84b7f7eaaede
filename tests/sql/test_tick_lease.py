"""The tick lease under a tick that finishes while another takes over its expired lease."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from .conftest import Q

# Stands in for the work that runs when a tick row is finished (the stream's queue frames are
# written by a trigger there): it widens the moment between locking the tick row and the rest
# of sftq.tick_finish to half a second.
SLOW_FINISH = """
CREATE FUNCTION sftq.test_slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$;
CREATE TRIGGER slow_finish AFTER UPDATE ON sftq.scheduler_ticks
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status IN ('ok', 'error'))
    EXECUTE FUNCTION sftq.test_slow();
"""


def test_a_finishing_tick_and_a_takeover_never_deadlock(db_url: str, q: Q) -> None:
    old = q.one("SELECT sftq.tick_begin('old', interval '10 milliseconds')")
    time.sleep(0.05)  # the old tick's lease has expired; it is still running
    with (
        psycopg.connect(db_url, autocommit=True) as c1,
        psycopg.connect(db_url, autocommit=True) as c2,
    ):
        c1.execute(SLOW_FINISH)

        def finish() -> Any:
            return c1.execute("SELECT sftq.tick_finish(%s, '{}'::jsonb)", (old,)).fetchone()

        def take_over() -> Any:
            time.sleep(0.2)  # while the old tick's finish is inside its slow part
            return c2.execute("SELECT sftq.tick_begin('new')").fetchone()

        with ThreadPoolExecutor(2) as pool:
            done, new = pool.submit(finish), pool.submit(take_over)
            # A lock-order inversion between the two shows up here as DeadlockDetected.
            done.result(timeout=10)
            new.result(timeout=10)
    status = q.one("SELECT status FROM sftq.scheduler_ticks WHERE id = %s", old)
    assert status in ("ok", "abandoned"), status
