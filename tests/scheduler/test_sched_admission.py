"""Admission through real ticks: caps, strict FIFO without backfill, the live quota."""

from __future__ import annotations

from typing import Any

import psycopg
from sched_support import (
    RecordingSimulator,
    create_user,
    enqueue,
    held_gpus,
    pid,
    progress_ids,
    sim_control,
    state,
)

from sftq_server.simulator import SimulatorServer

Conn = psycopg.Connection[Any]


def test_one_running_job_per_user(conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    alice, bob = create_user(conn, "alice"), create_user(conn, "bob")
    a_jobs = [enqueue(conn, alice) for _ in range(3)]
    b_job = enqueue(conn, bob)

    result = tick()
    assert result["status"] == "ok", result
    assert result["admitted"] == [str(a_jobs[0]), str(b_job)]
    assert result["submitted"] == 2
    assert progress_ids(conn) == {a_jobs[0], b_job}
    assert set(sim.sim_jobs()) == {pid(a_jobs[0]), pid(b_job)}

    # Plenty of GPUs, but alice is at her cap.
    assert tick()["admitted"] == []
    assert state(conn, a_jobs[1]) == "QUEUED"

    # Her running job ends: the same tick records it and admits her next one.
    sim.finish("SFT", pid(a_jobs[0]), "JOB_STATE_COMPLETED")
    result = tick()
    assert result["reconciled"] == 1
    assert result["admitted"] == [str(a_jobs[1])]
    assert state(conn, a_jobs[0]) == "SUCCESS"
    assert progress_ids(conn) == {a_jobs[1], b_job}


def test_strict_fifo_no_backfill(conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    sim.set_quota(max_value=8, external_usage=4)  # 4 GPUs free
    first, second = create_user(conn, "first"), create_user(conn, "second")
    big = enqueue(conn, first, "SFT", gpus=8)
    small = enqueue(conn, second, "DPO", gpus=4)

    # The head needs 8 with 4 free: nothing later may jump ahead, though it would fit.
    result = tick()
    assert result["budget"] == 4
    assert result["admitted"] == []
    assert state(conn, big) == "QUEUED" and state(conn, small) == "QUEUED"
    assert sim.sim_jobs() == {}

    sim.set_quota(external_usage=0)
    result = tick()
    assert result["admitted"] == [str(big)]
    assert state(conn, small) == "QUEUED"  # 0 GPUs left
    assert sim.sim_jobs()[pid(big)]["sim"]["gpuCount"] == 8

    sim.finish("SFT", pid(big), "JOB_STATE_COMPLETED")
    result = tick()
    assert state(conn, big) == "SUCCESS"
    assert result["admitted"] == [str(small)]


def test_fifo_over_all_kinds(conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    sim.set_quota(max_value=4)  # one 4-GPU job at a time
    order = []
    for i, kind in enumerate(("RFT", "SFT", "DPO", "SFT")):
        order.append((kind, enqueue(conn, create_user(conn, f"u{i}"), kind)))
    admitted = []
    for kind, job_id in order:
        result = tick()
        assert result["admitted"] == [str(job_id)], result
        admitted.append(job_id)
        sim.finish(kind, pid(job_id), "JOB_STATE_COMPLETED")
    tick()
    assert [state(conn, j) for _, j in order] == ["SUCCESS"] * 4


def test_external_usage_is_respected(conn: Conn, sim: RecordingSimulator,
                                     sim_server: SimulatorServer, tick: Any) -> None:
    sim_control(sim_server.url, "/_sim/quota", {"maxValue": 16, "external_usage": 8})
    jobs = [enqueue(conn, create_user(conn, f"u{i}")) for i in range(4)]
    result = tick()
    assert result["quota"] == {"limit": 16, "value": 16, "max_value": 16, "usage": 8}
    assert result["budget"] == 8
    assert result["admitted"] == [str(j) for j in jobs[:2]]
    assert held_gpus(sim) <= 16


def test_enforced_value_below_max_value(conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    sim.set_quota(max_value=16, value=8)
    jobs = [enqueue(conn, create_user(conn, f"u{i}")) for i in range(4)]
    result = tick()
    assert result["quota"]["limit"] == 8
    assert result["admitted"] == [str(j) for j in jobs[:2]]


def test_lagging_usage_never_overspends(conn: Conn, sim: RecordingSimulator,
                                       sim_server: SimulatorServer, tick: Any) -> None:
    # The provider's usage does not count our jobs for an hour: it keeps saying 0.
    sim_control(sim_server.url, "/_sim/quota", {"maxValue": 16, "usage_lag_seconds": 3600})
    jobs = [enqueue(conn, create_user(conn, f"u{i}")) for i in range(5)]
    result = tick()
    assert result["admitted"] == [str(j) for j in jobs[:4]]
    assert held_gpus(sim) == 16

    result = tick()
    assert result["quota"]["usage"] == 0  # the provider still says nothing is in use
    assert result["ours_recent"] == 16
    assert result["budget"] == 0
    assert result["admitted"] == []
    assert state(conn, jobs[4]) == "QUEUED"

    # Someone else starts using GPUs too: still nothing, and the budget goes negative.
    quota = sim_control(sim_server.url, "/_sim/quota", {"external_usage": 4})
    assert quota["quota"]["usage"] == 4  # the provider sees only the external GPUs
    result = tick()
    assert result["budget"] == -4 and result["admitted"] == []
    assert held_gpus(sim) == 20  # 16 ours + 4 external: we added nothing to it


def test_stuck_usage_after_grace_is_floored_by_our_jobs(conn: Conn, sim: RecordingSimulator,
                                                         tick: Any) -> None:
    # Past the grace window usage is trusted, but never below the GPUs of our own running jobs.
    sim.set_quota(max_value=16, usage_lag_seconds=3600)
    jobs = [enqueue(conn, create_user(conn, f"u{i}")) for i in range(5)]
    assert len(tick(usage_grace_seconds=0.0)["admitted"]) == 4
    result = tick(usage_grace_seconds=0.0)
    assert result["ours_recent"] == 0 and result["ours_total"] == 16
    assert result["budget"] == 0 and result["admitted"] == []
    assert state(conn, jobs[4]) == "QUEUED"


def test_no_admission_without_a_fresh_quota(conn: Conn, sim: RecordingSimulator,
                                            tick: Any) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    sim.set_faults(error_rate=1.0, statuses=[503])
    result = tick()
    assert result["status"] == "error"
    assert result["quota"] is None and result["budget"] is None
    assert result["admitted"] == []
    assert any(e.startswith("quota:") for e in result["errors"]), result["errors"]
    assert state(conn, job_id) == "QUEUED"

    sim.set_faults()
    assert tick()["admitted"] == [str(job_id)]


def test_tick_row_matches_the_result(conn: Conn, sim: RecordingSimulator, tick: Any) -> None:
    sim.set_quota(max_value=8, external_usage=2)
    jobs = [enqueue(conn, create_user(conn, f"u{i}"), gpus=2) for i in range(2)]
    result = tick()
    row = conn.execute(
        "SELECT status, quota_limit, quota_usage, budget, admitted, submitted, reconciled, "
        "cancelled, failed, errors, detail->'admitted_ids' FROM sftq.scheduler_ticks WHERE id = %s",
        (result["tick_id"],)).fetchone()
    assert row is not None
    assert row[:9] == ("ok", 8, 2, 6, 2, 2, 0, 0, 0)
    assert row[9] == [] and row[10] == [str(j) for j in jobs]
    lease = conn.execute("SELECT holder, tick_id FROM sftq.scheduler_lease").fetchone()
    assert lease == (None, None)  # released
