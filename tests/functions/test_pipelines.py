"""Pipelines through HTTP (issue 53 item 3): POST /jobs "after", the waiting reason, and the
real scheduler tick against the simulator admitting and cancelling dependents."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fn_support import SFT_PAYLOAD, Api, Db, assert_error

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.provider import FireworksClient
from sftq_server.scheduler.tick import run_tick
from sftq_server.simulator import Simulator, SimulatorServer

ACCOUNT = "test-account"
KEY = "fw-test-key"

DPO_PAYLOAD: dict[str, Any] = {
    "dataset": "accounts/trilogy/datasets/edullm-ela-dpo",
    # The SFT job's outputModel: the DPO starts from what the SFT trains.
    "trainingConfig": {"warmStartFrom": SFT_PAYLOAD["outputModel"],
                       "outputModel": "accounts/trilogy/models/out-v1-dpo"},
}


def pid(job_id: str) -> str:
    return "sftq-" + uuid.UUID(job_id).hex


@pytest.fixture
def sim() -> Simulator:
    return Simulator(account_id=ACCOUNT, job_seconds=0, max_value=64, seed=7)


@pytest.fixture
def tick(db_url: str, sim: Simulator) -> Iterator[Callable[[], dict[str, Any]]]:
    with SimulatorServer(sim) as server:
        settings = Settings(database_url=db_url, tick_secret="t" * 32,
                            fireworks_base_url=server.url, fireworks_api_key=KEY,
                            fireworks_account_id=ACCOUNT, fireworks_timeout_seconds=5.0,
                            submit_backoff_seconds=0.0)
        database = Database(db_url, max_size=2, timeout=5.0)
        client = FireworksClient(base_url=server.url, api_key=KEY, account_id=ACCOUNT,
                                 timeout=5.0)
        try:
            yield lambda: run_tick(database, client, settings, holder="test")
        finally:
            client.close()
            database.close()


def submit(api: Api, key: str, kind: str = "SFT", **fields: Any) -> dict[str, Any]:
    body = {"kind": kind, "gpu_count": 4,
            "fireworks_payload": DPO_PAYLOAD if kind == "DPO" else SFT_PAYLOAD, **fields}
    resp = api.post("/jobs", key, data=json.dumps(body), content_type="application/json")
    assert resp.status_code == 201, resp.get_data(as_text=True)
    return resp.json  # type: ignore[return-value]


def job(api: Api, key: str, job_id: str) -> dict[str, Any]:
    resp = api.get(f"/jobs/{job_id}", key)
    assert resp.status_code == 200
    return resp.json  # type: ignore[return-value]


def test_sft_then_dpo_runs_in_order_while_another_users_later_job_passes(
        api: Api, analytics: Api, db: Db, alice: str, bob: str, sim: Simulator,
        tick: Callable[[], dict[str, Any]]) -> None:
    sft = submit(api, alice)["id"]
    created = submit(api, alice, "DPO", after=[sft[:8]])
    dpo = created["id"]
    assert created["state"] == "QUEUED" and created["after"] == [sft]
    later = submit(api, bob)["id"]

    first = tick()
    # Bob's job, created after the DPO, is admitted while the DPO waits.
    assert first["admitted"] == [sft, later]
    shown = job(api, alice, dpo)
    assert shown["state"] == "QUEUED" and shown["after"] == [sft]
    assert shown["stalled"] is False and shown["max_run_seconds"] is None
    why = analytics.get(f"/jobs/{dpo}/analytics", alice).json["waiting_reason"]  # type: ignore[index]
    assert why["code"] == "waiting_for_dependency"
    assert sft in why["message"] and "PROGRESS" in why["message"]
    queue = analytics.get("/jobs/analytics/queue", alice).json  # type: ignore[union-attr]
    codes = [j["waiting_reason"]["code"] for j in queue["your_queued_jobs"]]
    assert codes == ["waiting_for_dependency"]
    assert tick()["admitted"] == []

    # The SFT succeeds at Fireworks: the tick that sees it admits the DPO in the same pass.
    sim.finish("SFT", pid(sft), "JOB_STATE_COMPLETED")
    third = tick()
    assert third["admitted"] == [dpo]
    assert job(api, alice, sft)["state"] == "SUCCESS"
    assert job(api, alice, dpo)["state"] == "PROGRESS"
    created_at_sim = {j["name"].rsplit("/", 1)[-1]: j for j in sim.jobs()}[pid(dpo)]
    assert created_at_sim["trainingConfig"]["warmStartFrom"] == SFT_PAYLOAD["outputModel"]
    events = [e["type"] for e in api.get(f"/jobs/{dpo}/events", alice).json["data"]]  # type: ignore[index]
    assert events[:4] == ["queued", "waiting_for_dependency", "dependencies_met",
                          "admitted"], events


def test_a_failed_dependency_cancels_the_dependent_with_the_reason(
        api: Api, alice: str, sim: Simulator,
        tick: Callable[[], dict[str, Any]]) -> None:
    sft = submit(api, alice)["id"]
    dpo = submit(api, alice, "DPO", after=[sft])["id"]
    tail = submit(api, alice, "DPO", after=[dpo])["id"]
    assert tick()["admitted"] == [sft]
    sim.finish("SFT", pid(sft), "JOB_STATE_FAILED")
    tick()
    shown = job(api, alice, dpo)
    assert shown["state"] == "CANCELLED"
    assert shown["error"] == f"cancelled: job {sft}, which this job runs after, ended FAIL"
    assert job(api, alice, tail)["state"] == "CANCELLED"
    assert job(api, alice, tail)["error"] == (
        f"cancelled: job {dpo}, which this job runs after, ended CANCELLED")
    events = api.get(f"/jobs/{dpo}/events", alice).json["data"]  # type: ignore[index]
    assert events[-1]["type"] == "dependency_failed", events
    assert events[-1]["data"]["after"] == sft and events[-1]["data"]["after_state"] == "FAIL"
    assert events[-1]["message"] == f"Cancelled: job {sft}, which it runs after, ended FAIL."


def test_after_refusals(api: Api, alice: str, bob: str) -> None:
    mine = submit(api, alice)["id"]
    bobs = submit(api, bob)["id"]
    nobody = str(uuid.uuid4())
    answers = []
    for ref in (bobs, nobody):
        resp = api.post("/jobs", alice, data=json.dumps(
            {"kind": "DPO", "fireworks_payload": DPO_PAYLOAD, "after": [mine, ref]}),
            content_type="application/json")
        body = assert_error(resp, 400, "unknown_dependency")
        answers.append(body["error"].replace(ref, "<id>"))
    # Another user's job looks exactly like a job that does not exist.
    assert answers[0] == answers[1] == "after: you have no job <id>"
    resp = api.submit(alice, after=[mine] * 21)
    assert "at most 20" in assert_error(resp, 400, "too_many_dependencies")["error"]
    assert_error(api.submit(alice, after=["not-an-id"]), 400, "validation_error")
    assert_error(api.submit(alice, after=mine), 400, "validation_error")
    # A NUL in an id (found by the noisy-neighbour test): a 400, never the database's 500.
    assert "NUL" in assert_error(api.submit(alice, after=[mine[:8] + "\x00"]), 400,
                                 "validation_error")["error"]
    api.delete(f"/jobs/{mine}", alice)
    assert_error(api.submit(alice, after=[mine]), 400, "dependency_ended")
    # Nothing was enqueued by a refusal: alice has her one cancelled job.
    assert len(api.get("/jobs", alice).json) == 1  # type: ignore[arg-type]


def test_max_run_seconds_is_validated_and_shown(api: Api, alice: str) -> None:
    created = submit(api, alice, max_run_seconds=3600)
    assert created["max_run_seconds"] == 3600 and created["after"] is None
    assert job(api, alice, created["id"])["max_run_seconds"] == 3600
    for bad in (59, 2_592_001, "60", 60.5):
        assert_error(api.submit(alice, max_run_seconds=bad), 400, "validation_error")


def test_an_idempotent_replay_must_ask_for_the_same_after(api: Api, alice: str) -> None:
    first, second = submit(api, alice)["id"], submit(api, alice)["id"]

    def post(after: list[str]) -> Any:
        body = {"kind": "DPO", "fireworks_payload": DPO_PAYLOAD, "after": after}
        return api.post("/jobs", alice, data=json.dumps(body), content_type="application/json",
                        headers={"Idempotency-Key": "pipeline-1"})

    made = post([first])
    assert made.status_code == 201
    again = post([first[:8]])  # the same job, named by its prefix
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json["id"] == made.json["id"]  # type: ignore[index]
    assert_error(post([second]), 409, "idempotency_conflict")
