"""What the provider says becomes the job's state: reconcile, rejection, adoption."""

from __future__ import annotations

import json
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
    pid,
    state,
)

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.provider import FireworksClient, ProviderJob, Transient
from sftq_server.scheduler.tick import run_tick

Conn = psycopg.Connection[Any]

FINISHES = [
    ("JOB_STATE_COMPLETED", None, "SUCCESS", None),
    ("JOB_STATE_FAILED", "loss diverged at step 40", "FAIL", "loss diverged at step 40"),
    ("JOB_STATE_EXPIRED", "ran past its deadline", "FAIL", "ran past its deadline"),
    ("JOB_STATE_EARLY_STOPPED", None, "FAIL", "JOB_STATE_EARLY_STOPPED"),
]


@pytest.mark.parametrize("path", ["get", "list"])
def test_reconcile_terminal_states(conn: Conn, sim: RecordingSimulator, tick: Any,
                                   path: str) -> None:
    # "get": at most 3 jobs per kind, one GET each; "list": 4 of one kind, one listing.
    kinds = ["SFT", "DPO", "RFT", "SFT"] if path == "get" else ["SFT"] * 4
    jobs = [enqueue(conn, create_user(conn, f"u{i}"), kind) for i, kind in enumerate(kinds)]
    assert len(tick()["admitted"]) == 4
    result = tick()
    assert result["reconciled"] == 0
    assert {job(conn, j)["provider_state"] for j in jobs} == {"JOB_STATE_RUNNING"}

    for (fw_state, message, _, _), kind, job_id in zip(FINISHES, kinds, jobs, strict=True):
        sim.finish(kind, pid(job_id), fw_state, message)
    sim.clear_requests()
    result = tick()
    assert result["reconciled"] == 4 and result["failed"] == 3, result
    for (fw_state, _, ours, error), job_id in zip(FINISHES, jobs, strict=True):
        row = job(conn, job_id)
        assert (row["state"], row["error"], row["provider_state"]) == (ours, error, fw_state)
    gets = [r for r in sim.requests() if r["method"] == "GET" and "quotas" not in r["path"]]
    if path == "list":
        assert [r["path"].rsplit("/", 1)[-1] for r in gets] == ["supervisedFineTuningJobs"]
    else:
        assert len(gets) == 4


def test_external_deletion_ends_cancelled(conn: Conn, sim: RecordingSimulator,
                                          provider: FireworksClient, tick: Any) -> None:
    sft = enqueue(conn, create_user(conn, "a"), "SFT")
    rft = enqueue(conn, create_user(conn, "b"), "RFT")
    tick()
    provider.delete_job("SFT", pid(sft))  # someone deletes it in the Fireworks console
    provider.cancel_job("RFT", pid(rft))
    result = tick()
    assert result["reconciled"] == 2 and result["cancelled"] == 2
    for job_id, seen in ((sft, "NOT_FOUND"), (rft, "JOB_STATE_CANCELLED")):
        row = job(conn, job_id)
        assert row["state"] == "CANCELLED"
        assert row["error"] == f"cancelled outside the queue (provider reported {seen})"
        # 'reconciled' is folded into 'cancelled'; detail.reason says where it happened.
        last = events(conn, job_id)[-1]
        assert last["event"] == "cancelled"
        assert last["detail"]["reason"] == ("deleted_outside" if seen == "NOT_FOUND"
                                            else "cancelled_outside")


def test_external_deletion_found_by_listing(conn: Conn, sim: RecordingSimulator,
                                            provider: FireworksClient, tick: Any) -> None:
    jobs = [enqueue(conn, create_user(conn, f"u{i}"), "DPO") for i in range(5)]
    tick()
    provider.delete_job("DPO", pid(jobs[2]))
    sim.clear_requests()
    result = tick()
    # One listing, one GET for the id it did not show (404), one quota read.
    assert result["provider_calls"] == 3, sim.requests()
    assert state(conn, jobs[2]) == "CANCELLED"
    assert [state(conn, j) for j in jobs[:2] + jobs[3:]] == ["PROGRESS"] * 4


@pytest.mark.parametrize(("ours", "external_prefix", "pages"),
                         [(5, "zz-ext", 1), (5, "aa-ext", 2), (210, None, 2)])
def test_reconcile_calls_grow_with_pages(conn: Conn, sim: RecordingSimulator,
                                         provider: FireworksClient, tick: Any, ours: int,
                                         external_prefix: str | None, pages: int) -> None:
    sim.set_quota(max_value=1000)
    if external_prefix:
        # Jobs of other tools in the same account; ids sort after ("zz") or before ("aa") ours.
        for i in range(250):
            provider.create_job("SFT", f"{external_prefix}-{i}", payload("SFT"), gpu_count=1)
    jobs = [enqueue(conn, create_user(conn, f"u{i}"), gpus=1) for i in range(ours)]
    assert len(tick()["admitted"]) == ours
    sim.clear_requests()
    result = tick()
    assert result["status"] == "ok"
    # Listing pages (stopping once all of ours are seen) plus one quota read.
    assert result["provider_calls"] == pages + 1, result
    assert {job(conn, j)["provider_state"] for j in jobs} == {"JOB_STATE_RUNNING"}


def test_rejected_payload_fails_with_the_body_verbatim(conn: Conn, sim: RecordingSimulator,
                                                       tick: Any) -> None:
    bad_sft = enqueue(conn, create_user(conn, "a"), "SFT", body=payload("SFT", valid=False))
    bad_rft = enqueue(conn, create_user(conn, "b"), "RFT", body=payload("RFT", valid=False))
    result = tick()
    assert result["status"] == "ok"  # the job failed, not the tick
    assert result["failed"] == 2 and result["submitted"] == 0
    for job_id, needle in ((bad_sft, 'field \\"dataset'), (bad_rft, "responseCandidatesCount")):
        [(status, body)] = sim.create_answers(pid(job_id))
        assert status == 400
        row = job(conn, job_id)
        assert row["state"] == "FAIL"
        assert row["error"] == body and needle in body
        json.loads(row["error"])  # the provider's JSON, untouched
    assert sim.sim_jobs() == {}


class LostAnswer(FireworksClient):
    """The create reaches the provider, but its answer never comes back (a timeout)."""

    def create_job(self, kind: str, job_id: str, payload: dict[str, Any], *,
                   gpu_count: int | None = None) -> ProviderJob:
        super().create_job(kind, job_id, payload, gpu_count=gpu_count)
        raise Transient(f"POST {kind} {job_id}: timed out (test: answer lost)")


def test_lost_create_answer_is_adopted_not_duplicated(conn: Conn, sim: RecordingSimulator,
                                                      database: Database, settings: Settings,
                                                      tick: Any) -> None:
    job_id = enqueue(conn, create_user(conn, "a"), "SFT")
    with LostAnswer(base_url=settings.fireworks_base_url, api_key=settings.fireworks_api_key,
                    account_id=ACCOUNT) as lossy:
        result = run_tick(database, lossy, settings)
    assert result["status"] == "error" and result["submitted"] == 0
    row = job(conn, job_id)
    assert row["state"] == "PROGRESS" and row["submitted_at"] is None
    assert "answer lost" in row["last_submit_error"]

    result = tick()
    assert result["submitted"] == 1, result
    row = job(conn, job_id)
    assert row["submitted_at"] is not None and row["last_submit_error"] is None
    assert row["fireworks_job_name"] == f"accounts/{ACCOUNT}/supervisedFineTuningJobs/{pid(job_id)}"
    assert [s for s, _ in sim.create_answers(pid(job_id))] == [200, 409]
    assert sim.created_ok()[pid(job_id)] == 1
    submitted = [e for e in events(conn, job_id) if e["event"] == "submitted"]
    assert len(submitted) == 1 and submitted[0]["detail"]["adopted_existing"] is True
