"""What the tick records of a running job (issue 11): the provider's sub-state, progress and
cost, with a provider_state event only when something changed; and queue timeouts, which
need no provider at all (issue 10)."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from sched_support import (
    ACCOUNT,
    RecordingSimulator,
    create_user,
    enqueue,
    events,
    job,
    payload,
    state,
)

Conn = psycopg.Connection[Any]


@pytest.fixture
def sim() -> RecordingSimulator:
    # A clock that moves only when the test says so: progress figures are exact.
    frozen = time.monotonic()
    return RecordingSimulator(account_id=ACCOUNT, job_seconds=0, max_value=64, seed=7,
                              clock=lambda: frozen)


def _provider_events(conn: Conn, job_id: Any) -> list[dict[str, Any]]:
    return [e["detail"] for e in events(conn, job_id) if e["event"] == "provider_state"]


def test_sub_state_progress_and_cost_with_events_only_on_change(
        conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    sim.job_seconds = 100.0  # jobs created from now on run 100 simulated seconds
    body = {**payload("SFT"), "epochs": 4}
    job_id = enqueue(conn, create_user(conn, "alice"), body=body)
    tick()
    assert job(conn, job_id)["provider_state"] == "JOB_STATE_CREATING"
    assert _provider_events(conn, job_id) == []

    sim.advance(0.7)  # PENDING: a cost estimate appears, no progress yet
    tick()
    row = job(conn, job_id)
    assert row["provider_state"] == "JOB_STATE_PENDING"
    assert row["estimated_cost"] == {"currencyCode": "USD", "units": "0", "nanos": 277777778}
    assert row["progress_percent"] is None
    assert len(_provider_events(conn, job_id)) == 1
    tick()  # nothing changed: no event
    assert len(_provider_events(conn, job_id)) == 1

    sim.advance(30)  # RUNNING, 30%, epoch 2 of 4
    tick()
    row = job(conn, job_id)
    assert (row["provider_state"], row["progress_percent"], row["progress_epoch"]) == \
        ("JOB_STATE_RUNNING", 30, 2)
    assert _provider_events(conn, job_id)[-1] == {
        "provider_state": "JOB_STATE_RUNNING", "progress_percent": 30, "progress_epoch": 2,
        "estimated_cost": row["estimated_cost"]}
    sim.advance(5)  # 35%: the columns move, but the same tenth writes no event
    tick()
    assert job(conn, job_id)["progress_percent"] == 35
    assert len(_provider_events(conn, job_id)) == 2
    sim.advance(10)  # 45%: a new tenth
    tick()
    assert len(_provider_events(conn, job_id)) == 3

    sim.advance(53.8)  # the last second: WRITING_RESULTS
    tick()
    row = job(conn, job_id)
    assert (row["provider_state"], row["progress_percent"], row["progress_epoch"]) == \
        ("JOB_STATE_WRITING_RESULTS", 99, 4)
    sim.advance(0.5)
    assert tick()["reconciled"] == 1
    assert state(conn, job_id) == "SUCCESS"
    assert job(conn, job_id)["progress_percent"] == 100
    states = [d["provider_state"] for d in _provider_events(conn, job_id)]
    assert states == ["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_RUNNING",
                      "JOB_STATE_WRITING_RESULTS"]


def test_a_listing_carries_progress_too(conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    sim.job_seconds = 100.0
    jobs = [enqueue(conn, create_user(conn, f"u{i}")) for i in range(5)]  # > 3: a listing
    tick()
    sim.advance(20)
    sim.clear_requests()
    tick()
    assert not any(r["method"] == "GET" and "sftq-" in r["path"] for r in sim.requests())
    assert {job(conn, j)["progress_percent"] for j in jobs} == {20}


def test_queue_timeout_cancels_in_the_next_tick_even_with_the_provider_down(
        conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    sim.set_quota(max_value=4, external_usage=4)  # nothing can be admitted
    alice = create_user(conn, "alice")
    row = conn.execute("SELECT id FROM sftq.enqueue(%s, 'SFT', %s::jsonb, NULL, 4, NULL, NULL, 1)",
                       (alice, psycopg.types.json.Jsonb(payload("SFT")))).fetchone()
    assert row is not None
    timed, patient = row[0], enqueue(conn, alice)
    assert tick()["queue_timeouts"] == 0
    time.sleep(1.1)
    sim.set_faults(error_rate=1.0, statuses=[503])
    result = tick()
    assert (result["queue_timeouts"], result["cancelled"]) == (1, 1)
    done = job(conn, timed)
    assert done["state"] == "CANCELLED" and done["error"].startswith("timed out in the queue")
    assert events(conn, timed)[-1]["event"] == "queue_timeout"
    assert state(conn, patient) == "QUEUED"
