"""The pre-flight's provider checks (issue 44, item 2) through real HTTP against the simulator:
jobs-api asks Fireworks whether the dataset, evaluator and models exist (and what an SFT job
would cost) within its budget; what it cannot ask in time, the tick asks while the job waits,
and a job whose dataset does not exist ends FAIL while still queued, never created."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from fn_support import Db

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.http.gateway import make_server
from sftq_server.provider import FireworksClient
from sftq_server.scheduler.tick import run_tick
from sftq_server.simulator import Simulator, SimulatorServer

ACCOUNT = "sim-account"
DATASET = f"accounts/{ACCOUNT}/datasets/chats"
SFT = {"dataset": DATASET, "baseModel": "accounts/fireworks/models/qwen3-8b"}
RFT = {"dataset": DATASET, "evaluator": f"accounts/{ACCOUNT}/evaluators/judge",
       "inferenceParameters": {"responseCandidatesCount": 4}}


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    with SimulatorServer(Simulator(account_id=ACCOUNT, job_seconds=3600)) as running:
        yield running


def _settings(db_url: str, sim: SimulatorServer, **changes: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": db_url, "preflight": True, "fireworks_base_url": sim.url,
        "fireworks_api_key": "sim-key", "fireworks_account_id": ACCOUNT,
        "fireworks_timeout_seconds": 2.0, "preflight_budget_ms": 1000.0}
    values.update(changes)
    return Settings(**values)


@pytest.fixture
def serve(db_url: str, sim: SimulatorServer) -> Iterator[Any]:
    servers: list[Any] = []

    def start(**changes: Any) -> str:
        server = make_server("127.0.0.1", 0, _settings(db_url, sim, **changes))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}/functions/v1/jobs-api"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
        server.app.close()


@pytest.fixture
def key(db: Db) -> str:
    return db.user("alice")


def post(base: str, key: str, body: dict[str, Any], path: str = "/jobs") -> httpx.Response:
    return httpx.post(base + path, json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=10)


def job_row(db_url: str, job_id: str) -> dict[str, Any]:
    with psycopg.connect(db_url) as conn:
        cur = conn.execute("SELECT state, failure_class, error, warnings, estimated_cost, "
                           "preflight_checked_at, submitted_at, started_at, completed_at "
                           "FROM sftq.jobs WHERE id = %s", (job_id,))
        names = [d.name for d in cur.description or ()]
        row = cur.fetchone()
        assert row is not None
        return dict(zip(names, row, strict=True))


def creates(sim: SimulatorServer) -> list[dict[str, Any]]:
    return [r for r in sim.simulator.requests()
            if r["method"] == "POST" and r["path"].endswith("Jobs") and not r["fault"]]


def tick(db_url: str, sim: SimulatorServer) -> dict[str, Any]:
    db = Database(db_url, max_size=2)
    client = FireworksClient(base_url=sim.url, api_key="sim-key", account_id=ACCOUNT,
                             timeout=2.0)
    try:
        return run_tick(db, client, _settings(db_url, sim))
    finally:
        client.close()
        db.close()


def test_a_missing_dataset_is_refused_at_enqueue(serve: Any, key: str, db_url: str,
                                                 sim: SimulatorServer) -> None:
    base = serve()
    sim.simulator.set_resources({"resources": {DATASET: None}})
    answer = post(base, key, {"kind": "SFT", "fireworks_payload": SFT})
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["code"] == "invalid_fireworks_payload"
    assert body["details"] == [{
        "path": "fireworks_payload.dataset",
        "message": f"dataset {DATASET} does not exist at Fireworks: create or upload it first, "
                   "or fix the name (the job would fail at submission)"}]
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM sftq.jobs").fetchone() == (0,)
    # Asked with GETs only: nothing was created at the provider.
    assert creates(sim) == []


def test_an_rft_job_without_its_evaluator_is_refused(serve: Any, key: str,
                                                     sim: SimulatorServer) -> None:
    base = serve()
    sim.simulator.set_resources({"resources": {RFT["evaluator"]: None}})
    answer = post(base, key, {"kind": "RFT", "fireworks_payload": RFT})
    assert answer.status_code == 400, answer.text
    paths = [d["path"] for d in answer.json()["details"]]
    assert paths == ["fireworks_payload.evaluator"], answer.text


def test_the_cost_and_the_doubts_reach_the_201_and_the_job(serve: Any, key: str, db_url: str,
                                                          sim: SimulatorServer) -> None:
    base = serve()
    sim.simulator.set_resources({"resources": {DATASET: "UPLOADING"}})
    answer = post(base, key, {"kind": "SFT", "gpu_count": 8, "fireworks_payload": SFT})
    assert answer.status_code == 201, answer.text
    body = answer.json()
    # 8 GPUs for the simulator's hour at its made-up 2.5 USD a GPU-hour.
    assert body["estimated_cost"] == {"currencyCode": "USD", "units": "20", "nanos": 0}
    assert [w["path"] for w in body["warnings"]] == ["fireworks_payload.dataset"]
    assert "UPLOADING, not READY" in body["warnings"][0]["message"]
    got = httpx.get(f"{base}/jobs/{body['id']}", headers={"Authorization": f"Bearer {key}"})
    job = got.json()
    assert job["estimated_cost"] == body["estimated_cost"]
    assert job["warnings"] == body["warnings"]
    row = job_row(db_url, body["id"])
    assert row["preflight_checked_at"] is not None and row["state"] == "QUEUED"


def test_validate_runs_every_check_and_enqueues_nothing(serve: Any, key: str, db_url: str,
                                                        sim: SimulatorServer) -> None:
    base = serve()
    sim.simulator.set_resources({"resources": {"accounts/fireworks/models/qwen3-8b": None}})
    answer = post(base, key, {"kind": "SFT", "fireworks_payload": SFT}, "/jobs:validate")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["valid"] is False and body["provider_checks"] == "done"
    assert [e["path"] for e in body["errors"]] == ["fireworks_payload.baseModel"]
    sim.simulator.set_resources({"reset": True})
    body = post(base, key, {"kind": "SFT", "fireworks_payload": SFT}, "/jobs:validate").json()
    assert body["valid"] is True and body["errors"] == []
    assert body["estimated_cost"]["currencyCode"] == "USD"
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM sftq.jobs").fetchone() == (0,)


def test_validate_of_a_misshapen_payload_asks_the_provider_nothing(
        serve: Any, key: str, sim: SimulatorServer) -> None:
    """Issue 52: a definite shape error already says the job would fail; looking up its
    resources would only spend the account's shared requests (a loop of such validates used
    to spend a whole minute's FIREWORKS_RPM)."""
    base = serve()
    sim.simulator.set_resources({"resources": {DATASET: "UPLOADING"}})
    sim.simulator.clear_requests()
    body = post(base, key, {"kind": "SFT", "fireworks_payload": SFT | {"learningrate": 0.1}},
                "/jobs:validate").json()
    assert body["valid"] is False and body["provider_checks"] == "skipped"
    assert [e["path"] for e in body["errors"]] == ["fireworks_payload.learningrate"]
    assert body["warnings"] == [] and body["estimated_cost"] is None
    assert sim.simulator.requests() == []


def test_a_slow_provider_leaves_the_check_to_the_tick_which_fails_the_job_while_queued(
        serve: Any, key: str, db_url: str, sim: SimulatorServer) -> None:
    # The provider answers slower than the budget: the job is accepted at once, unchecked.
    base = serve(preflight_budget_ms=150.0)
    sim.simulator.set_faults(latency_ms=400)
    answer = post(base, key, {"kind": "SFT", "fireworks_payload": SFT})
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    assert "estimated_cost" not in answer.json()
    assert job_row(db_url, job_id)["preflight_checked_at"] is None
    # Meanwhile the dataset is gone, and the quota has no room: nothing could be admitted.
    sim.simulator.set_faults()
    sim.simulator.set_quota(max_value=0)
    sim.simulator.set_resources({"resources": {DATASET: None}})
    result = tick(db_url, sim)
    assert result["admitted"] == [] and result["preflight_failed"] == 1, result
    row = job_row(db_url, job_id)
    assert (row["state"], row["failure_class"], row["submitted_at"]) == ("FAIL", "permanent", None)
    assert row["started_at"] == row["completed_at"]  # never seen running
    assert f"dataset {DATASET} does not exist at Fireworks" in row["error"]
    assert creates(sim) == []
    events = httpx.get(f"{base}/jobs/{job_id}/events",
                       headers={"Authorization": f"Bearer {key}"}).json()["data"]
    assert [e["type"] for e in events] == ["queued", "preflight_failed", "failed"]
    assert events[-1]["data"]["reason"] == "preflight_failed"
    assert events[-1]["data"]["findings"][0]["path"] == "fireworks_payload.dataset"
    assert "the pre-flight check found dataset" in events[-1]["message"]
    assert "never sent to the provider" in events[-1]["message"]


def test_without_credentials_jobs_api_leaves_it_to_the_tick(serve: Any, key: str, db_url: str,
                                                           sim: SimulatorServer) -> None:
    base = serve(fireworks_api_key="", fireworks_account_id="")
    answer = post(base, key, {"kind": "SFT", "fireworks_payload": SFT})
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    assert sim.simulator.requests() == []
    sim.simulator.set_quota(max_value=0)
    result = tick(db_url, sim)
    assert result["preflight_checked"] == 1, result
    row = job_row(db_url, job_id)
    assert row["state"] == "QUEUED" and row["preflight_checked_at"] is not None
    assert row["estimated_cost"] == {"currencyCode": "USD", "units": "10", "nanos": 0}
    # Checked once: the next tick does not ask again.
    sim.simulator.clear_requests()
    assert tick(db_url, sim)["preflight_checked"] == 0
    assert not [r for r in sim.simulator.requests() if "/datasets/" in r["path"]]


def test_validate_off_skips_the_provider_checks_too(serve: Any, key: str, db_url: str,
                                                   sim: SimulatorServer) -> None:
    base = serve()
    sim.simulator.set_resources({"resources": {DATASET: None}})
    answer = post(base, key, {"kind": "SFT", "fireworks_payload": SFT, "validate": "off"})
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    sim.simulator.set_quota(max_value=0)
    tick(db_url, sim)
    assert job_row(db_url, job_id)["state"] == "QUEUED"
    assert not [r for r in sim.simulator.requests() if "/datasets/" in r["path"]]
