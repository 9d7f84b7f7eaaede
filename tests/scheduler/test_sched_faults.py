"""Faults: provider outages, database failures, concurrent and overlapping ticks, killed
ticks, and the Fireworks key staying out of every output."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
import time
import uuid
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from sched_support import (
    ACCOUNT,
    API_KEY,
    RecordingSimulator,
    cancel,
    child_env,
    create_user,
    enqueue,
    events,
    job,
    payload,
    pid,
    progress_ids,
    state,
    tick_command,
)

from sftq_server import db as sql
from sftq_server.core.errors import Unavailable
from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.provider import FireworksClient, ProviderJob, Transient
from sftq_server.scheduler.tick import MAX_CONSECUTIVE_TRANSIENT, run_tick
from sftq_server.simulator import SimulatorServer

Conn = psycopg.Connection[Any]


def _client(cls: type[FireworksClient], settings: Settings, **extra: Any) -> Any:
    return cls(base_url=settings.fireworks_base_url, api_key=settings.fireworks_api_key,
               account_id=ACCOUNT, **extra)


class FailingCreate(FireworksClient):
    def create_job(self, kind: str, job_id: str, payload: dict[str, Any], *,
                   gpu_count: int | None = None) -> ProviderJob:
        raise Transient("POST: HTTP 503: unavailable (test)", status=503)


def _snapshot(conn: Conn) -> dict[Any, tuple[Any, ...]]:
    rows = conn.execute("SELECT id, state, submitted_at, cancel_requested_at, fireworks_job_name, "
                        "completed_at FROM sftq.jobs").fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


@pytest.mark.parametrize("fault", ["errors", "timeouts"])
def test_provider_outage_leaves_every_job_as_it_was(conn: Conn, sim: RecordingSimulator,
                                                    database: Database, settings: Settings,
                                                    make_provider: Any, fault: str) -> None:
    # Usage that lags (as Fireworks' does) so that our own jobs are not counted twice.
    sim.set_quota(max_value=12, usage_lag_seconds=3600)
    users = [create_user(conn, f"u{i}") for i in range(6)]
    running = [enqueue(conn, users[i], kind) for i, kind in enumerate(("SFT", "RFT"))]
    run_tick(database, make_provider(), settings)
    with _client(FailingCreate, settings) as failing:
        unsubmitted = enqueue(conn, users[2], "DPO", gpus=2)
        run_tick(database, failing, settings)  # admitted, create failed: PROGRESS, unsubmitted
    assert job(conn, unsubmitted)["state"] == "PROGRESS"
    cancel(conn, users[1], running[1])  # a cancel waiting for the provider
    queued = [enqueue(conn, users[i]) for i in (3, 4)]
    before = _snapshot(conn)

    if fault == "errors":
        sim.set_faults(error_rate=1.0, statuses=[500, 502, 503, 429])
        provider = make_provider()
    else:
        sim.set_faults(timeout_rate=1.0, timeout_seconds=1.0)
        provider = make_provider(timeout=0.2)
    started = time.monotonic()
    for _ in range(3):
        result = run_tick(database, provider, settings)
        assert result["status"] == "error"
        # The tick stops calling a provider that keeps failing, but for one quota read: the
        # failures might belong to a few jobs' creates only, and admission must not stall
        # behind them (tests/reliability: jobs whose creates keep failing).
        assert result["provider_calls"] <= MAX_CONSECUTIVE_TRANSIENT + 1
        assert any("no more provider calls" in e for e in result["errors"]), result["errors"]
        assert _snapshot(conn) == before
    assert time.monotonic() - started < 10
    assert job(conn, unsubmitted)["state"] == "PROGRESS"

    sim.set_faults()
    # The 429s among the errors came with Retry-After: 1, which the ticks honour.
    time.sleep(1.1)
    result = run_tick(database, make_provider(), settings)
    assert result["status"] == "ok", result
    assert state(conn, running[1]) == "CANCELLED"
    assert job(conn, unsubmitted)["submitted_at"] is not None
    assert state(conn, running[0]) == "PROGRESS"
    assert all(state(conn, q) in ("QUEUED", "PROGRESS") for q in queued)


def test_transient_create_errors_never_fail_a_job(conn: Conn, sim: RecordingSimulator,
                                                  database: Database, settings: Settings,
                                                  tick: Any) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    with _client(FailingCreate, settings) as failing:
        for attempt in range(1, 6):
            result = run_tick(database, failing, settings)
            assert result["failed"] == 0
            row = job(conn, job_id)
            assert row["state"] == "PROGRESS" and row["submit_attempts"] == attempt
            assert "HTTP 503" in row["last_submit_error"]
    assert tick()["submitted"] == 1
    assert sim.created_ok()[pid(job_id)] == 1


class FlakyDatabase(Database):
    """A database that fails some statements: `fail` names them, or `after` counts calls."""

    def __init__(self, url: str, *, fail: set[str] | None = None, after: int | None = None):
        super().__init__(url, max_size=2, timeout=2.0)
        self.fail, self.after, self.calls = fail or set(), after, 0

    def _check(self, query: str) -> None:
        self.calls += 1
        if query in self.fail or (self.after is not None and self.calls > self.after):
            raise Unavailable("the database is not reachable right now; retry shortly")

    def fetchone(self, query: str, params: Any = ()) -> Any:
        self._check(query)
        return super().fetchone(query, params)

    def fetchall(self, query: str, params: Any = ()) -> Any:
        self._check(query)
        return super().fetchall(query, params)


def test_database_error_mid_tick(conn: Conn, sim: RecordingSimulator, db_url: str,
                                 provider: FireworksClient, settings: Settings,
                                 tick: Any) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    flaky = FlakyDatabase(db_url, fail={sql.ADMIT_FOR_QUOTA})
    try:
        result = run_tick(flaky, provider, settings)
    finally:
        flaky.close()
    assert result["status"] == "error"
    assert result["errors"] == ["database: the database is not reachable right now; retry shortly"]
    assert state(conn, job_id) == "QUEUED"
    row = conn.execute("SELECT status FROM sftq.scheduler_ticks WHERE id = %s",
                       (result["tick_id"],)).fetchone()
    assert row == ("error",)
    assert tick()["admitted"] == [str(job_id)]  # the lease was released


def test_database_gone_mid_tick_lease_expires(conn: Conn, sim: RecordingSimulator,
                                              db_url: str, provider: FireworksClient,
                                              settings: Settings, tick: Any) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    short = Settings(**{**settings.__dict__, "tick_lease_seconds": 0.5})
    dying = FlakyDatabase(db_url, after=2)  # tick_begin and scheduler_work, then nothing
    try:
        result = run_tick(dying, provider, short)
    finally:
        dying.close()
    assert result["status"] == "error"
    assert any("could not record the tick" in e for e in result["errors"])
    assert tick() == {"status": "skipped"}
    time.sleep(0.6)
    assert tick()["admitted"] == [str(job_id)]
    statuses = [r[0] for r in conn.execute("SELECT status FROM sftq.scheduler_ticks ORDER BY id")]
    assert statuses == ["abandoned", "ok"]


def test_begin_without_database_raises_unavailable(provider: FireworksClient,
                                                   settings: Settings) -> None:
    from sftq_server.dev.pgcluster import free_port

    nowhere = Database(f"postgresql://postgres@127.0.0.1:{free_port()}/none", timeout=1.0)
    try:
        with pytest.raises(Unavailable):
            run_tick(nowhere, provider, settings)
    finally:
        nowhere.close()


def test_the_key_never_leaks(conn: Conn, sim: RecordingSimulator, database: Database,
                             settings: Settings, make_provider: Any,
                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    users = [create_user(conn, f"u{i}") for i in range(4)]
    jobs = [enqueue(conn, users[0]),
            enqueue(conn, users[1], "SFT", body=payload("SFT", valid=False))]
    results = [run_tick(database, make_provider(), settings)]
    cancel(conn, users[0], jobs[0])
    sim.set_faults(error_rate=0.5, timeout_rate=0.3, timeout_seconds=0.5)
    jobs += [enqueue(conn, users[i]) for i in (2, 3)]
    for _ in range(4):
        results.append(run_tick(database, make_provider(timeout=0.2), settings))
    sim.set_faults()
    results.append(run_tick(database, make_provider(), settings))
    assert any(r["errors"] for r in results)  # the errors path was exercised
    dumped = json.dumps(results)
    stored = json.dumps(
        [conn.execute("SELECT coalesce(json_agg(t), '[]') FROM sftq.scheduler_ticks t").fetchone(),
         conn.execute("SELECT coalesce(json_agg(e), '[]') FROM sftq.job_events e").fetchone(),
         conn.execute("SELECT json_agg(j.error) FROM sftq.jobs j").fetchone()], default=str)
    for text in (dumped, stored, caplog.text, repr(make_provider())):
        assert API_KEY not in text


def test_ticks_fired_together_admit_nothing_twice(conn: Conn, sim: RecordingSimulator,
                                                  database: Database, settings: Settings,
                                                  make_provider: Any) -> None:
    sim.set_quota(max_value=24)  # room for 6 of the 8 jobs each round
    threads_n = 6
    all_admitted: list[str] = []
    for round_ in range(4):
        jobs = [enqueue(conn, create_user(conn, f"r{round_}u{i}")) for i in range(8)]
        providers = [make_provider() for _ in range(threads_n)]
        barrier = threading.Barrier(threads_n)
        results: list[dict[str, Any]] = [{} for _ in range(threads_n)]

        def fire(i: int, providers: Any = providers, barrier: Any = barrier,
                 results: Any = results) -> None:
            barrier.wait()
            results[i] = run_tick(database, providers[i], settings, holder=f"t{i}")

        threads = [threading.Thread(target=fire, args=(i,)) for i in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ran = [r for r in results if r["status"] != "skipped"]
        assert len(ran) >= 1
        admitted = [j for r in ran for j in r["admitted"]]
        assert len(admitted) == len(set(admitted)) == 6
        all_admitted += admitted
        # Clear the round so the next one starts empty: cancel what waits, finish what runs.
        for j in jobs:
            if state(conn, j) == "QUEUED":
                row = conn.execute("SELECT user_id FROM sftq.jobs WHERE id = %s", (j,)).fetchone()
                assert row is not None
                cancel(conn, row[0], j)
        for j in progress_ids(conn):
            sim.finish("SFT", pid(j), "JOB_STATE_COMPLETED")
        run_tick(database, providers[0], settings)
        assert sorted(state(conn, j) for j in jobs) == ["CANCELLED"] * 2 + ["SUCCESS"] * 6
    assert len(all_admitted) == len(set(all_admitted))
    counts = sim.created_ok()
    assert all(counts[pid(j)] == 1 for j in all_admitted)
    assert sum(counts.values()) == len(all_admitted)


def test_admission_itself_serialises_without_the_lease(conn: Conn, db_url: str) -> None:
    # Belt and braces under the lease: admissions racing each other (a lease that expired
    # under a slow tick) still never admit a job twice or overspend the budget.
    jobs = [enqueue(conn, create_user(conn, f"u{i}"), gpus=2) for i in range(20)]
    n = 8
    barrier = threading.Barrier(n)
    out: list[list[str]] = [[] for _ in range(n)]

    def admit(i: int) -> None:
        with psycopg.connect(db_url, autocommit=True, prepare_threshold=None) as c:
            barrier.wait()
            answer = c.execute(sql.ADMIT_FOR_QUOTA, (16, Decimal("0"), 300.0)).fetchone()
            assert answer is not None
            out[i] = [j["job_id"] for j in answer[0]["jobs"]]

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    admitted = [j for part in out for j in part]
    assert len(admitted) == len(set(admitted)) == 8  # 16 GPUs / 2, once each
    assert admitted and sorted(admitted) == sorted(str(j) for j in jobs[:8])


class SlowAnswer(FireworksClient):
    """Creates land at once, but each answer takes `delay` seconds to come back."""

    def __init__(self, *, applied: threading.Event, delay: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.applied, self.delay = applied, delay

    def create_job(self, kind: str, job_id: str, payload: dict[str, Any], *,
                   gpu_count: int | None = None) -> ProviderJob:
        created = super().create_job(kind, job_id, payload, gpu_count=gpu_count)
        self.applied.set()
        time.sleep(self.delay)
        return created


def test_overlapping_ticks_after_lease_expiry_never_duplicate(
        conn: Conn, sim: RecordingSimulator, database: Database, settings: Settings,
        make_provider: Any) -> None:
    jobs = [enqueue(conn, create_user(conn, f"u{i}")) for i in range(3)]
    short = Settings(**{**settings.__dict__, "tick_lease_seconds": 0.3})
    applied = threading.Event()
    slow_result: dict[str, Any] = {}
    with _client(SlowAnswer, settings, applied=applied, delay=0.8) as slow:
        thread = threading.Thread(target=lambda: slow_result.update(
            run_tick(database, slow, short, holder="slow")))
        thread.start()
        assert applied.wait(10)
        time.sleep(0.4)  # the slow tick's lease has expired while its create is in flight
        fast = run_tick(database, make_provider(), short, holder="fast")
        thread.join()
    assert fast["status"] == "ok", fast
    assert any("lease lost" in e for e in slow_result["errors"]), slow_result
    counts = sim.created_ok()
    assert [counts[pid(j)] for j in jobs] == [1, 1, 1]
    for j in jobs:
        row = job(conn, j)
        assert row["state"] == "PROGRESS" and row["submitted_at"] is not None
        assert len([e for e in events(conn, j) if e["event"] == "submitted"]) == 1


def test_killed_tick_lease_expires(conn: Conn, sim: RecordingSimulator,
                                   sim_server: SimulatorServer, db_url: str,
                                   tick: Any, tmp_path: Any) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    sim.set_faults(latency_ms=5000)  # the child hangs in its first provider call
    out = (tmp_path / "child.out").open("w")
    child = subprocess.Popen(
        tick_command(db_url, sim_server.url), stdout=out, stderr=subprocess.STDOUT,
        env=child_env(SFTQ_TICK_LEASE_SECONDS="1.5", FIREWORKS_TIMEOUT="10"))
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if conn.execute("SELECT 1 FROM sftq.scheduler_ticks WHERE status = 'running'"
                            ).fetchone() and sim.requests():
                break
            time.sleep(0.05)
        else:
            pytest.fail("the child tick never started")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        out.close()
    assert child.returncode == -signal.SIGKILL
    sim.set_faults()

    assert tick() == {"status": "skipped"}
    deadline = time.monotonic() + 5
    while (result := tick()) == {"status": "skipped"}:
        assert time.monotonic() < deadline, "the dead tick's lease never expired"
        time.sleep(0.1)
    assert result["admitted"] == [str(job_id)]
    rows = conn.execute("SELECT status FROM sftq.scheduler_ticks ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["abandoned", "ok"]
    assert uuid.UUID(result["admitted"][0]) in progress_ids(conn)
