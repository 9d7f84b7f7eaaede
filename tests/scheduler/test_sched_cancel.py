"""Cancels: the provider call each kind needs, deferred cancels, and a cancel racing a create."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from sched_support import (
    ACCOUNT,
    KIND_COLLECTION,
    RecordingSimulator,
    cancel,
    create_user,
    enqueue,
    events,
    job,
    pid,
    sim_control,
    state,
)

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.provider import FireworksClient, ProviderJob, Transient
from sftq_server.scheduler.tick import run_tick
from sftq_server.simulator import SimulatorServer

Conn = psycopg.Connection[Any]


def _client(cls: type[FireworksClient], settings: Settings, **extra: Any) -> Any:
    return cls(base_url=settings.fireworks_base_url, api_key=settings.fireworks_api_key,
               account_id=ACCOUNT, **extra)


@pytest.mark.parametrize(("kind", "action", "method", "suffix"), [
    ("SFT", "provider_delete", "DELETE", ""),
    ("DPO", "provider_delete", "DELETE", ""),
    ("RFT", "provider_cancel", "POST", ":cancel"),
])
def test_cancel_uses_the_kinds_provider_call(conn: Conn, sim: RecordingSimulator,
                                             sim_server: SimulatorServer, tick: Any,
                                             kind: str, action: str, method: str,
                                             suffix: str) -> None:
    user = create_user(conn, "alice")
    job_id = enqueue(conn, user, kind)
    tick()
    assert cancel(conn, user, job_id) == action
    assert state(conn, job_id) == "PROGRESS"  # until the provider confirms the stop
    sim.clear_requests()

    result = tick()
    assert result["cancelled"] == 1, result
    assert state(conn, job_id) == "CANCELLED"
    path = f"/v1/accounts/{ACCOUNT}/{KIND_COLLECTION[kind]}/{pid(job_id)}"
    stops = [(r["method"], r["path"], r["body"])
             for r in sim_control(sim_server.url, "/_sim/requests")
             if r["method"] in ("DELETE", "POST")]
    assert stops == [(method, path + suffix, {} if method == "POST" else None)]
    if kind == "RFT":
        assert sim.sim_jobs()[pid(job_id)]["state"] == "JOB_STATE_CANCELLED"
    else:
        assert pid(job_id) not in sim.sim_jobs()
    last = events(conn, job_id)[-1]
    assert (last["event"], last["actor"], last["to_state"]) == ("cancelled", "scheduler",
                                                                "CANCELLED")
    assert last["detail"]["provider_action"] == ("cancel" if kind == "RFT" else "delete")


class FailingCreate(FireworksClient):
    def create_job(self, kind: str, job_id: str, payload: dict[str, Any], *,
                   gpu_count: int | None = None) -> ProviderJob:
        raise Transient("POST: HTTP 503: unavailable (test)", status=503)


def test_cancel_of_a_never_submitted_job(conn: Conn, sim: RecordingSimulator,
                                         database: Database, settings: Settings,
                                         tick: Any) -> None:
    user = create_user(conn, "alice")
    job_id = enqueue(conn, user, "DPO")
    with _client(FailingCreate, settings) as failing:
        run_tick(database, failing, settings)
    assert state(conn, job_id) == "PROGRESS" and job(conn, job_id)["submitted_at"] is None
    assert cancel(conn, user, job_id) == "deferred"

    result = tick()
    assert result["cancelled"] == 1 and result["submitted"] == 0
    assert state(conn, job_id) == "CANCELLED"
    # The deterministic id is stopped blindly (404 here), and nothing is ever created.
    assert sim.calls_on(pid(job_id)) == [
        ("DELETE", f"/v1/accounts/{ACCOUNT}/dpoJobs/{pid(job_id)}")]
    assert sim.created_ok()[pid(job_id)] == 0


class CancelDuringCreate(FireworksClient):
    """A user's cancel lands while the create is in flight, before or after it reaches
    the provider."""

    def __init__(self, *, conn: Conn, user: int, job_id: Any, when: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.conn, self.user, self.job_id, self.when = conn, user, job_id, when

    def create_job(self, kind: str, job_id: str, payload: dict[str, Any], *,
                   gpu_count: int | None = None) -> ProviderJob:
        if self.when == "before":
            assert cancel(self.conn, self.user, self.job_id) == "deferred"
        created = super().create_job(kind, job_id, payload, gpu_count=gpu_count)
        if self.when == "after":
            assert cancel(self.conn, self.user, self.job_id) == "deferred"
        return created


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("kind", ["SFT", "RFT"])
def test_cancel_racing_a_create(conn: Conn, sim: RecordingSimulator, database: Database,
                                settings: Settings, kind: str, when: str) -> None:
    user = create_user(conn, "alice")
    job_id = enqueue(conn, user, kind)
    with _client(CancelDuringCreate, settings, conn=conn, user=user, job_id=job_id,
                 when=when) as racing:
        result = run_tick(database, racing, settings)
    assert result["submitted"] == 1 and result["cancelled"] == 1, result
    assert state(conn, job_id) == "CANCELLED"
    calls = [m for m, _ in sim.calls_on(pid(job_id))]
    assert calls == ["POST", "POST" if kind == "RFT" else "DELETE"]
    assert sim.created_ok()[pid(job_id)] == 1
    if kind == "RFT":
        assert sim.sim_jobs()[pid(job_id)]["state"] == "JOB_STATE_CANCELLED"
    else:
        assert pid(job_id) not in sim.sim_jobs()
    assert events(conn, job_id)[-1]["detail"]["raced_create"] is True


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it in the tick runs (not even a finally that cares)."""


class DiesAfterCreate(FireworksClient):
    def create_job(self, kind: str, job_id: str, payload: dict[str, Any], *,
                   gpu_count: int | None = None) -> ProviderJob:
        super().create_job(kind, job_id, payload, gpu_count=gpu_count)
        raise Killed


@pytest.mark.parametrize("then_cancel", [True, False])
def test_tick_killed_after_create(conn: Conn, sim: RecordingSimulator, database: Database,
                                  settings: Settings, tick: Any, then_cancel: bool) -> None:
    user = create_user(conn, "alice")
    job_id = enqueue(conn, user, "SFT")
    short = Settings(**{**settings.__dict__, "tick_lease_seconds": 0.5})
    with _client(DiesAfterCreate, settings) as dying, pytest.raises(Killed):
        run_tick(database, dying, short)
    row = job(conn, job_id)
    assert row["state"] == "PROGRESS" and row["submitted_at"] is None
    assert pid(job_id) in sim.sim_jobs()  # the provider has it; we never recorded it
    if then_cancel:
        assert cancel(conn, user, job_id) == "deferred"

    assert tick() == {"status": "skipped"}  # the dead tick still holds the lease
    time.sleep(0.6)
    result = tick()
    assert result["status"] == "ok", result
    dead = conn.execute("SELECT status FROM sftq.scheduler_ticks ORDER BY id LIMIT 1").fetchone()
    assert dead == ("abandoned",)
    assert sim.created_ok()[pid(job_id)] == 1
    if then_cancel:
        assert state(conn, job_id) == "CANCELLED"
        assert pid(job_id) not in sim.sim_jobs()  # the orphan was stopped
    else:
        assert result["submitted"] == 1
        assert [s for s, _ in sim.create_answers(pid(job_id))] == [200, 409]
        assert job(conn, job_id)["submitted_at"] is not None


def test_failed_stop_is_retried_next_tick(conn: Conn, sim: RecordingSimulator,
                                          tick: Any) -> None:
    user = create_user(conn, "alice")
    job_id = enqueue(conn, user, "SFT")
    tick()
    cancel(conn, user, job_id)
    sim.set_faults(error_rate=1.0, statuses=[503, 429])
    result = tick()
    assert result["status"] == "error" and result["cancelled"] == 0
    row = job(conn, job_id)
    assert row["state"] == "PROGRESS" and row["cancel_requested_at"] is not None
    sim.set_faults()
    assert tick()["cancelled"] == 1
    assert state(conn, job_id) == "CANCELLED"
