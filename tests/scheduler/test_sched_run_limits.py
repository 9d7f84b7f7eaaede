"""Run limits through real ticks against the simulator (issue 53 item 4): a job past its
max_run_seconds is stopped with its kind's call and ends CANCELLED (run_timeout); a job whose
progress stood still gets one stalled event and keeps running.

The tick runs at the database's now(), so these tests move the job's clock back instead of
waiting: its submission (and last provider state change) an hour or more in the past."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from sched_support import (
    ACCOUNT,
    KIND_COLLECTION,
    RecordingSimulator,
    create_user,
    enqueue,
    events,
    job,
    pid,
    sim_control,
    state,
)

from sftq_server.simulator import SimulatorServer

Conn = psycopg.Connection[Any]


def age(conn: Conn, job_id: Any, seconds: int) -> None:
    """Make the job look submitted (and last changed at the provider) `seconds` ago."""
    conn.execute("UPDATE sftq.jobs SET submitted_at = now() - make_interval(secs => %s), "
                 "provider_state_at = now() - make_interval(secs => %s) WHERE id = %s",
                 (seconds, seconds, job_id))


@pytest.mark.parametrize(("kind", "method", "suffix"), [
    ("SFT", "DELETE", ""),
    ("DPO", "DELETE", ""),
    ("RFT", "POST", ":cancel"),
])
def test_a_job_past_max_run_seconds_is_stopped_with_its_kinds_call(
        conn: Conn, sim: RecordingSimulator, sim_server: SimulatorServer, tick: Any,
        kind: str, method: str, suffix: str) -> None:
    user = create_user(conn, "alice")
    job_id = enqueue(conn, user, kind)
    conn.execute("UPDATE sftq.jobs SET max_run_seconds = 600 WHERE id = %s", (job_id,))
    tick()
    assert state(conn, job_id) == "PROGRESS"
    age(conn, job_id, 599)
    tick()
    assert state(conn, job_id) == "PROGRESS"  # not yet past its bound
    age(conn, job_id, 601)
    sim.clear_requests()

    result = tick()
    assert result["cancelled"] == 1, result
    row = job(conn, job_id)
    assert row["state"] == "CANCELLED"
    assert row["error"].startswith("stopped: it ran at Fireworks for 60")
    assert row["error"].endswith("past its max_run_seconds (600 s)")
    path = f"/v1/accounts/{ACCOUNT}/{KIND_COLLECTION[kind]}/{pid(job_id)}"
    stops = [(r["method"], r["path"]) for r in sim_control(sim_server.url, "/_sim/requests")
             if r["method"] in ("DELETE", "POST")]
    assert stops == [(method, path + suffix)]
    evs = events(conn, job_id)
    assert [e["event"] for e in evs[-2:]] == ["cancel_requested", "run_timeout"]
    assert evs[-2]["detail"]["reason"] == "run_timeout"
    assert evs[-1]["to_state"] == "CANCELLED" and evs[-1]["detail"]["reason"] == "run_timeout"
    assert evs[-1]["detail"]["provider_action"] == ("cancel" if kind == "RFT" else "delete")


def test_the_deployment_default_bounds_jobs_without_their_own(
        conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    user = create_user(conn, "alice")
    job_id = enqueue(conn, user)
    tick()
    age(conn, job_id, 7200)
    tick()  # no SFTQ_MAX_RUN_SECONDS: no bound
    assert state(conn, job_id) == "PROGRESS"
    tick(max_run_seconds=3600)
    row = job(conn, job_id)
    assert row["state"] == "CANCELLED" and row["max_run_seconds"] == 3600
    assert events(conn, job_id)[-1]["event"] == "run_timeout"


def test_a_failed_stop_stays_recorded_and_the_next_tick_finishes_it(
        conn: Conn, sim: RecordingSimulator, sim_server: SimulatorServer, tick: Any) -> None:
    user = create_user(conn, "alice")
    job_id = enqueue(conn, user)
    conn.execute("UPDATE sftq.jobs SET max_run_seconds = 60 WHERE id = %s", (job_id,))
    tick()
    age(conn, job_id, 120)
    sim_control(sim_server.url, "/_sim/faults", {"statuses": [503], "error_rate": 1.0})
    tick()
    assert state(conn, job_id) == "PROGRESS"
    assert job(conn, job_id)["cancel_reason"] == "run_timeout"
    sim_control(sim_server.url, "/_sim/faults", {})
    tick()
    assert state(conn, job_id) == "CANCELLED"
    assert events(conn, job_id)[-1]["event"] == "run_timeout"


def test_a_stalled_job_gets_one_event_and_keeps_running(
        conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    user = create_user(conn, "alice")
    job_id = enqueue(conn, user)
    tick()
    age(conn, job_id, 3600)
    tick(stall_seconds=7200)
    assert [e["event"] for e in events(conn, job_id)].count("stalled") == 0
    age(conn, job_id, 7300)
    tick(stall_seconds=7200)
    tick(stall_seconds=7200)
    evs = [e for e in events(conn, job_id) if e["event"] == "stalled"]
    assert len(evs) == 1 and evs[0]["detail"]["stall_seconds"] == 7200
    assert state(conn, job_id) == "PROGRESS"
    shown = conn.execute("SELECT sftq.job_json(j) FROM sftq.jobs j WHERE id = %s",
                         (job_id,)).fetchone()
    assert shown is not None and shown[0]["stalled"] is True
