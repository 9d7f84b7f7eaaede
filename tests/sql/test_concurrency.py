"""Several connections interleaved on purpose: invariants 1 (cap), 2 (FIFO) and 5 (legal
transitions, each with its event) hold under concurrency."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from .conftest import COUNTER_DRIFT, Q

LEGAL = {
    ("QUEUED", "PROGRESS"),
    ("QUEUED", "CANCELLED"),
    ("PROGRESS", "SUCCESS"),
    ("PROGRESS", "FAIL"),
    ("PROGRESS", "CANCELLED"),
}


def _blocked(conn: psycopg.Connection[Any], pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row[0] == "Lock"


def _wait_until_blocked(watch: psycopg.Connection[Any], pid: int) -> None:
    deadline = time.monotonic() + 10
    while not _blocked(watch, pid):
        assert time.monotonic() < deadline, "the other session never waited for the lock"
        time.sleep(0.01)


def _while_held(
    db_url: str,
    q: Q,
    hold: Callable[[psycopg.Connection[Any]], Any],
    query: str,
    *,
    commit: bool = True,
) -> tuple[Any, Any]:
    """Run `hold` in an open transaction, start `query` in a second session, check that it
    waits for the first, then commit (or roll back) the first. Returns what each answered."""
    with psycopg.connect(db_url) as c1, psycopg.connect(db_url, autocommit=True) as c2:
        held = hold(c1)
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(lambda: c2.execute(query).fetchall())
            _wait_until_blocked(q.conn, c2.info.backend_pid)
            c1.commit() if commit else c1.rollback()
            return held, fut.result(timeout=10)


ADMIT_4 = "SELECT job_id FROM sftq.admit(4)"


def test_two_concurrent_admits_never_admit_twice(db_url: str, q: Q) -> None:
    users = [q.user(f"u{i}") for i in range(6)]
    for u in users:
        q.enqueue(u, gpus=4)
    admit = "SELECT sftq.admit_for_quota(12, 0)"
    first, rows = _while_held(db_url, q, lambda c: c.execute(admit).fetchone()[0], admit)
    second = rows[0][0]
    assert len(first["jobs"]) == 3
    # The second call counted the first call's GPUs (the provider's usage still says 0).
    assert second["budget"] == 0 and second["jobs"] == []
    assert q.one("SELECT count(*) FROM sftq.jobs WHERE state = 'PROGRESS'") == 3
    assert q.one("SELECT count(*) FROM sftq.job_events WHERE event = 'admitted'") == 3


def test_admit_waits_for_an_enqueue_in_flight(db_url: str, q: Q) -> None:
    """An earlier job whose enqueue has not committed yet is not overtaken."""
    a, w = q.user("a"), q.user("w")
    late: list[Any] = []

    def enqueue_early(c: psycopg.Connection[Any]) -> Any:
        early = c.execute("SELECT id FROM sftq.enqueue(%s, 'SFT', '{}'::jsonb, NULL, 4)", (a,))
        late.append(q.enqueue(w, gpus=4))  # created after, committed first
        return early.fetchone()[0]

    early, admitted = _while_held(db_url, q, enqueue_early, ADMIT_4)
    assert admitted == [(early,)]
    assert q.state(late[0]) == "QUEUED"


def test_cancel_that_rolls_back_does_not_let_a_later_job_jump(db_url: str, q: Q) -> None:
    a, b = q.user("a"), q.user("b")
    head = q.enqueue(a, gpus=4)
    q.enqueue(a, gpus=4)
    q.enqueue(b, gpus=4)
    cancel = lambda c: c.execute("SELECT * FROM sftq.cancel(%s, %s)", (a, head))  # noqa: E731
    _, admitted = _while_held(db_url, q, cancel, ADMIT_4, commit=False)
    assert admitted == [(head,)]


def test_cancel_that_commits_hands_over_in_order(db_url: str, q: Q) -> None:
    a, b = q.user("a"), q.user("b")
    head = q.enqueue(a, gpus=4)
    b1 = q.enqueue(b, gpus=4)
    a2 = q.enqueue(a, gpus=4)
    cancel = lambda c: c.execute("SELECT * FROM sftq.cancel(%s, %s)", (a, head))  # noqa: E731
    _, admitted = _while_held(db_url, q, cancel, ADMIT_4)
    assert admitted == [(b1,)]
    assert q.state(a2) == "QUEUED"


_CHECK_AFTER_ADMIT = """
-- Run inside the admitting transaction, still under its exclusive gate.
SELECT
  (SELECT count(*) FROM (SELECT user_id FROM sftq.jobs WHERE state = 'PROGRESS'
                          GROUP BY user_id HAVING count(*) > 1) s) AS over_cap,
  (SELECT COALESCE(sum(gpu_count), 0) FROM sftq.jobs WHERE state = 'PROGRESS') AS gpus,
  (SELECT count(*) FROM sftq.jobs y JOIN sftq.users u ON u.id = y.user_id
    WHERE y.state = 'QUEUED' AND u.running_count < u.max_running
      AND EXISTS (SELECT 1 FROM sftq.jobs x WHERE x.id = ANY (%s::uuid[])
                    AND (y.created_at, y.id) < (x.created_at, x.id))) AS overtaken,
  (SELECT count(*) FROM sftq.users u
    WHERE u.running_count <> (SELECT count(*) FROM sftq.jobs j WHERE j.user_id = u.id AND j.state = 'PROGRESS')
       OR u.queued_count <> (SELECT count(*) FROM sftq.jobs j WHERE j.user_id = u.id AND j.state = 'QUEUED')
       OR u.head_job_id IS DISTINCT FROM (SELECT j.id FROM sftq.jobs j WHERE j.user_id = u.id
                                           AND j.state = 'QUEUED' ORDER BY j.created_at, j.id LIMIT 1)
  ) AS bad_counters
"""


def test_random_interleavings_keep_cap_fifo_budget_and_transitions(db_url: str, q: Q) -> None:
    quota = 24
    users = [q.user(f"u{i}") for i in range(8)]
    stop = time.monotonic() + 4.0
    violations: list[str] = []
    errors: list[BaseException] = []

    def producer(seed: int) -> None:
        rng = random.Random(seed)
        with psycopg.connect(db_url, autocommit=True) as c:
            while time.monotonic() < stop:
                u = rng.choice(users)
                op = rng.random()
                if op < 0.6:
                    c.execute(
                        "SELECT * FROM sftq.enqueue(%s, %s, '{}'::jsonb, NULL, %s)",
                        (u, rng.choice(["SFT", "DPO", "RFT"]), rng.choice([1, 2, 4, 8])),
                    )
                else:
                    row = c.execute(
                        "SELECT id FROM sftq.jobs WHERE user_id = %s AND state IN ('QUEUED', 'PROGRESS') "
                        "ORDER BY random() LIMIT 1",
                        (u,),
                    ).fetchone()
                    if row:
                        try:
                            c.execute("SELECT * FROM sftq.cancel(%s, %s)", (u, row[0]))
                            c.execute(
                                "SELECT sftq.complete_cancel(id) FROM sftq.jobs "
                                "WHERE id = %s AND cancel_requested_at IS NOT NULL",
                                (row[0],),
                            )
                        except psycopg.Error as exc:
                            if exc.sqlstate != "SQ409":
                                raise  # only a race to a terminal state (409) is expected

    def finisher(seed: int) -> None:
        rng = random.Random(seed)
        with psycopg.connect(db_url, autocommit=True) as c:
            while time.monotonic() < stop:
                row = c.execute(
                    "SELECT id FROM sftq.jobs WHERE state = 'PROGRESS' ORDER BY random() LIMIT 1"
                ).fetchone()
                if row:
                    c.execute(
                        "SELECT sftq.record_provider_state(%s, %s, 'x')",
                        (
                            row[0],
                            rng.choice(
                                ["JOB_STATE_COMPLETED", "JOB_STATE_FAILED", "JOB_STATE_RUNNING"]
                            ),
                        ),
                    )
                time.sleep(0.002)

    def batcher(seed: int) -> None:
        # Group-commit enqueues over several users at once (they hold several user rows),
        # and the queue-timeout sweep (it does too): neither may close a lock cycle.
        rng = random.Random(seed)
        with psycopg.connect(db_url, autocommit=True) as c:
            while time.monotonic() < stop:
                some = rng.sample(users, rng.randint(2, 4))
                n = len(some)
                c.execute(
                    "SELECT * FROM sftq.enqueue_many(%s::bigint[], %s::text[], %s::jsonb[], "
                    "%s::text[], %s::int[], %s::text[], %s::int[])",
                    (some, [rng.choice(["SFT", "DPO", "RFT"]) for _ in some], ["{}"] * n,
                     [None] * n, [rng.choice([1, 2, 4, 8]) for _ in some], [None] * n,
                     [rng.choice([None, 1]) for _ in some]),
                ).fetchall()
                if rng.random() < 0.2:
                    c.execute("SELECT sftq.expire_queued()")

    def admitter() -> None:
        with psycopg.connect(db_url) as c:
            while time.monotonic() < stop:
                res = c.execute("SELECT sftq.admit_for_quota(%s, 0)", (quota,)).fetchone()[0]
                ids = [j["job_id"] for j in res["jobs"]]
                over_cap, gpus, overtaken, bad = c.execute(_CHECK_AFTER_ADMIT, (ids,)).fetchone()
                c.commit()
                if over_cap:
                    violations.append(f"{over_cap} users above cap")
                if gpus > quota:
                    violations.append(f"{gpus} GPUs in use > quota {quota}")
                if ids and overtaken:
                    violations.append(f"{overtaken} earlier eligible jobs overtaken")
                if bad:
                    violations.append(f"{bad} users with wrong counters or head")
                time.sleep(0.001)

    def run(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(producer, i)) for i in range(4)]
    threads += [threading.Thread(target=run, args=(finisher, 10 + i)) for i in range(2)]
    threads += [threading.Thread(target=run, args=(admitter,)) for _ in range(2)]
    threads += [threading.Thread(target=run, args=(batcher, 20 + i)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert not violations, violations[:5]
    assert q.one("SELECT count(*) FROM sftq.job_events WHERE event = 'admitted'") > 10

    assert q.all(COUNTER_DRIFT) == []
    # Invariant 5: every job's recorded path is a chain of legal transitions ending in its state.
    paths: dict[Any, list[tuple[str, str]]] = {}
    for job, frm, to in q.all(
        "SELECT job_id, from_state, to_state FROM sftq.job_events "
        "WHERE to_state IS NOT NULL ORDER BY id"
    ):
        paths.setdefault(job, []).append((frm, to))
    for job, state in q.all("SELECT id, state FROM sftq.jobs"):
        current = "QUEUED"
        for frm, to in paths.get(job, []):
            assert frm == current and (frm, to) in LEGAL, (job, paths[job])
            current = to
        assert current == state
