"""The Fireworks simulator speaks the documented Fireworks semantics, and its /_sim surface."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from sftq_server.provider import FireworksClient, Transient
from sftq_server.simulator import Simulator, SimulatorServer, job_gpus

BASE = "/v1/accounts/sim-account"
SFT = {"dataset": "accounts/a/datasets/d", "baseModel": "m"}
RFT = {
    "dataset": "d",
    "evaluator": "e",
    "inferenceParameters": {"responseCandidatesCount": 2},
}


def _create(http: httpx.Client, collection: str, job_id: str, body: object) -> httpx.Response:
    params = {
        "supervisedFineTuningJobs": "supervisedFineTuningJobId",
        "dpoJobs": "dpoJobId",
        "reinforcementFineTuningJobs": "reinforcementFineTuningJobId",
    }
    return http.post(f"{BASE}/{collection}", params={params[collection]: job_id}, json=body)


def _google_error(response: httpx.Response, status: int, code: int) -> str:
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["code"] == code and isinstance(body["message"], str) and body["details"] == []
    return str(body["message"])


# -- transport and errors -------------------------------------------------------------------


def test_auth_is_required_but_any_key_works(server: SimulatorServer) -> None:
    with httpx.Client(base_url=server.url, timeout=5.0) as bare:
        _google_error(bare.get(f"{BASE}/quotas"), 401, 16)
        no_token = bare.get(f"{BASE}/quotas", headers={"Authorization": "Bearer"})
        _google_error(no_token, 401, 16)
        basic = bare.get(f"{BASE}/quotas", headers={"Authorization": "Basic abc"})
        _google_error(basic, 401, 16)
        ok = bare.get(f"{BASE}/quotas", headers={"Authorization": "Bearer anything"})
        assert ok.status_code == 200
        # The control surface needs no key.
        assert bare.get("/_sim/health").json()["ok"] is True


def test_unknown_account_path_and_method(http: httpx.Client) -> None:
    _google_error(http.get("/v1/accounts/someone-else/dpoJobs"), 403, 7)
    _google_error(http.get(f"{BASE}/deployments"), 404, 5)
    _google_error(http.get("/v1/models"), 404, 5)
    _google_error(http.get("/elsewhere"), 404, 5)
    _google_error(http.put(f"{BASE}/dpoJobs", json={}), 405, 12)
    _google_error(http.post(f"{BASE}/quotas/training-h200-count", json={}), 405, 12)


def test_create_generates_an_id_when_none_is_given(http: httpx.Client) -> None:
    response = http.post(f"{BASE}/dpoJobs", json={"dataset": "d"})
    assert response.status_code == 200
    name = response.json()["name"]
    assert name.startswith("accounts/sim-account/dpoJobs/")
    job_id = name.rsplit("/", 1)[-1]
    assert http.get(f"{BASE}/dpoJobs/{job_id}").status_code == 200


@pytest.mark.parametrize("job_id", ["Upper", "-lead", "trail-", "a" * 64, "under_score"])
def test_invalid_ids_are_rejected(http: httpx.Client, job_id: str) -> None:
    _google_error(_create(http, "supervisedFineTuningJobs", job_id, SFT), 400, 3)


@pytest.mark.parametrize("body", [[1, 2], "text", 7, None])
def test_non_object_body_is_400(http: httpx.Client, body: object) -> None:
    _google_error(_create(http, "dpoJobs", "j1", body), 400, 3)


def test_invalid_json_body_is_400(http: httpx.Client) -> None:
    response = http.post(
        f"{BASE}/dpoJobs",
        params={"dpoJobId": "j1"},
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    _google_error(response, 400, 3)


def test_validation_matches_fireworks(http: httpx.Client) -> None:
    assert _create(http, "supervisedFineTuningJobs", "ok-sft", SFT).status_code == 200
    assert _create(http, "dpoJobs", "ok-dpo", {"dataset": "d"}).status_code == 200
    assert _create(http, "reinforcementFineTuningJobs", "ok-rft", RFT).status_code == 200
    as_string = {**RFT, "inferenceParameters": {"responseCandidatesCount": "3"}}
    assert _create(http, "reinforcementFineTuningJobs", "ok-rft2", as_string).status_code == 200

    message = _google_error(_create(http, "supervisedFineTuningJobs", "x", {}), 400, 3)
    assert "dataset" in message
    message = _google_error(_create(http, "dpoJobs", "x", {"dataset": ""}), 400, 3)
    assert "dataset" in message
    no_evaluator = {k: v for k, v in RFT.items() if k != "evaluator"}
    message = _google_error(_create(http, "reinforcementFineTuningJobs", "x", no_evaluator), 400, 3)
    assert "evaluator" in message
    one = {**RFT, "inferenceParameters": {"responseCandidatesCount": 1}}
    message = _google_error(_create(http, "reinforcementFineTuningJobs", "x", one), 400, 3)
    assert "responseCandidatesCount" in message


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_body_must_be_the_kinds_own_shape(http: httpx.Client) -> None:
    # Issue 54 item 8: an SFT body sent as DPO used to succeed. Fireworks' JSON parsing refuses
    # a field the kind's message does not have, and a value of the wrong type.
    sft = json.loads((EXAMPLES / "sft.json").read_text())
    message = _google_error(_create(http, "dpoJobs", "sft-as-dpo", sft), 400, 3)
    assert 'unknown field "baseModel"' in message, message
    message = _google_error(_create(http, "reinforcementFineTuningJobs", "sft-as-rft", sft), 400, 3)
    assert "unknown field" in message, message
    dpo = json.loads((EXAMPLES / "dpo.json").read_text())
    message = _google_error(_create(http, "supervisedFineTuningJobs", "dpo-as-sft", dpo), 400, 3)
    assert 'unknown field "trainingConfig"' in message, message
    # Nested fields and types are checked too.
    wrong = {**dpo, "trainingConfig": {**dpo["trainingConfig"], "epoch": 2}}
    message = _google_error(_create(http, "dpoJobs", "nested", wrong), 400, 3)
    assert 'unknown field "trainingConfig.epoch"' in message, message
    wrong = {**sft, "epochs": "two"}
    message = _google_error(_create(http, "supervisedFineTuningJobs", "typed", wrong), 400, 3)
    assert "epochs" in message and "integer" in message, message
    wrong = {**dpo, "lossConfig": {"method": "DPOO"}}
    message = _google_error(_create(http, "dpoJobs", "enum", wrong), 400, 3)
    assert "lossConfig.method" in message, message
    assert http.get(f"{BASE}/dpoJobs/sft-as-dpo").status_code == 404  # nothing was made
    # What the proto3 JSON mapping allows passes: an int64 as a string, null, and output-only
    # fields of a resource read back (ignored).
    fine = {**sft, "epochs": "2", "loraRank": None, "state": "JOB_STATE_RUNNING"}
    assert _create(http, "supervisedFineTuningJobs", "lenient", fine).status_code == 200


@pytest.mark.parametrize("kind", ["sft", "dpo", "rft"])
def test_the_example_payloads_are_accepted_by_their_kind(http: httpx.Client, kind: str) -> None:
    collection = {"sft": "supervisedFineTuningJobs", "dpo": "dpoJobs",
                  "rft": "reinforcementFineTuningJobs"}[kind]
    body = json.loads((EXAMPLES / f"{kind}.json").read_text())
    r = _create(http, collection, f"example-{kind}", body)
    assert r.status_code == 200, r.text


def test_duplicate_id_is_409(http: httpx.Client) -> None:
    assert _create(http, "supervisedFineTuningJobs", "dup", SFT).status_code == 200
    message = _google_error(_create(http, "supervisedFineTuningJobs", "dup", SFT), 409, 6)
    assert "already exists" in message
    # Ids are per collection, as Fireworks' resource names are.
    assert _create(http, "dpoJobs", "dup", {"dataset": "d"}).status_code == 200


# -- resources and lifecycle ----------------------------------------------------------------


def test_job_resource_shape_and_lifecycle(
    http: httpx.Client, advance: Callable[[float], None]
) -> None:
    body = {
        **SFT,
        "displayName": "my run",
        "epochs": 2,
        "wandbConfig": {"enabled": False},
        "state": "JOB_STATE_COMPLETED",  # output-only: ignored
        "completedTime": "2000-01-01T00:00:00Z",
    }
    created = _create(http, "supervisedFineTuningJobs", "shape", body).json()
    assert created["name"] == "accounts/sim-account/supervisedFineTuningJobs/shape"
    assert created["displayName"] == "my run" and created["epochs"] == 2
    assert created["wandbConfig"] == {"enabled": False}
    assert created["state"] == "JOB_STATE_CREATING"
    assert created["status"] == {"code": "OK", "message": ""}
    assert created["createTime"].endswith("Z") and "completedTime" not in created

    advance(1.0)  # CREATING lasts min(1 s, job_seconds / 10)
    running = http.get(f"{BASE}/supervisedFineTuningJobs/shape").json()
    assert running["state"] == "JOB_STATE_RUNNING"
    assert running["createTime"] == created["createTime"]
    assert running["updateTime"] > created["updateTime"]
    advance(29.0)
    # Half way through 2 epochs: the second epoch has begun.
    assert http.get(f"{BASE}/supervisedFineTuningJobs/shape").json()["jobProgress"] == {
        "percent": 50,
        "epoch": 2,
    }
    advance(30.0)
    done = http.get(f"{BASE}/supervisedFineTuningJobs/shape").json()
    assert done["state"] == "JOB_STATE_COMPLETED"
    assert done["completedTime"] == done["updateTime"] > done["createTime"]


def test_a_job_completes_at_its_end_whatever_the_clock_reads() -> None:
    # A monotonic clock reads a large float: (t0 + 100.0) - t0 can come out a hair under
    # 100.0. The job must still be COMPLETED once its 100 seconds have passed, not stay in
    # WRITING_RESULTS for a rounding error (seen as a flaky scheduler test).
    t0 = next(t for t in (1000.0 + k * 0.1234567 for k in range(100_000))
              if (t + 100.0) - t < 100.0)
    sim = Simulator(job_seconds=100.0, clock=lambda: t0)
    with (
        SimulatorServer(sim) as srv,
        httpx.Client(base_url=srv.url, headers={"Authorization": "Bearer k"}, timeout=5.0) as http,
    ):
        _create(http, "dpoJobs", "edge", {"dataset": "d"})
        sim.advance(99.5)
        assert http.get(f"{BASE}/dpoJobs/edge").json()["state"] == "JOB_STATE_WRITING_RESULTS"
        sim.advance(0.5)
        assert http.get(f"{BASE}/dpoJobs/edge").json()["state"] == "JOB_STATE_COMPLETED"


def test_zero_job_seconds_never_completes_on_its_own(
    clock: Callable[[], float], advance: Callable[[float], None]
) -> None:
    sim = Simulator(job_seconds=0, clock=clock)
    with (
        SimulatorServer(sim) as srv,
        httpx.Client(base_url=srv.url, headers={"Authorization": "Bearer k"}, timeout=5.0) as http,
    ):
        assert _create(http, "dpoJobs", "forever", {"dataset": "d"}).json()["state"] == (
            "JOB_STATE_RUNNING"
        )
        advance(10**7)
        assert http.get(f"{BASE}/dpoJobs/forever").json()["state"] == "JOB_STATE_RUNNING"
        finished = http.post(
            "/_sim/jobs/dpoJobs/forever:finish", json={"state": "JOB_STATE_COMPLETED"}
        )
        assert finished.status_code == 200 and finished.json()["state"] == "JOB_STATE_COMPLETED"


@pytest.mark.parametrize(
    ("state", "code"),
    [
        ("JOB_STATE_COMPLETED", "OK"),
        ("JOB_STATE_FAILED", "INTERNAL"),
        ("JOB_STATE_EXPIRED", "DEADLINE_EXCEEDED"),
        ("JOB_STATE_EARLY_STOPPED", "OK"),
        ("JOB_STATE_CANCELLED", "CANCELLED"),
    ],
)
def test_finish_control(http: httpx.Client, state: str, code: str) -> None:
    _create(http, "reinforcementFineTuningJobs", "fin", RFT)
    response = http.post(
        "/_sim/jobs/reinforcementFineTuningJobs/fin:finish", json={"state": state, "message": "why"}
    )
    assert response.status_code == 200
    job = http.get(f"{BASE}/reinforcementFineTuningJobs/fin").json()
    assert job == response.json()
    assert job["state"] == state and job["status"] == {"code": code, "message": "why"}
    assert "completedTime" in job


def test_finish_control_errors(http: httpx.Client, sim: Simulator) -> None:
    _create(http, "dpoJobs", "fin", {"dataset": "d"})
    _google_error(
        http.post("/_sim/jobs/dpoJobs/nope:finish", json={"state": "JOB_STATE_FAILED"}), 404, 5
    )
    _google_error(
        http.post("/_sim/jobs/dpoJobs/fin:finish", json={"state": "JOB_STATE_RUNNING"}), 400, 3
    )
    _google_error(http.post("/_sim/jobs/dpoJobs/fin:finish", json={}), 400, 3)
    # Kind names work as well as collections from Python.
    assert sim.finish("DPO", "fin", "JOB_STATE_FAILED")["state"] == "JOB_STATE_FAILED"
    with pytest.raises(KeyError):
        sim.finish("SFT", "fin", "JOB_STATE_FAILED")
    with pytest.raises(ValueError):
        sim.finish("DPO", "fin", "JOB_STATE_PAUSED")


def test_delete_removes_and_frees_the_id(http: httpx.Client) -> None:
    _create(http, "supervisedFineTuningJobs", "gone", SFT)
    deleted = http.delete(f"{BASE}/supervisedFineTuningJobs/gone")
    assert deleted.status_code == 200 and deleted.json() == {}
    _google_error(http.get(f"{BASE}/supervisedFineTuningJobs/gone"), 404, 5)
    _google_error(http.delete(f"{BASE}/supervisedFineTuningJobs/gone"), 404, 5)
    assert _create(http, "supervisedFineTuningJobs", "gone", SFT).status_code == 200


def test_rft_cancel_keeps_resource_and_is_idempotent(http: httpx.Client) -> None:
    _create(http, "reinforcementFineTuningJobs", "rc", RFT)
    for _ in range(2):
        response = http.post(f"{BASE}/reinforcementFineTuningJobs/rc:cancel", json={})
        assert response.status_code == 200 and response.json() == {}
    job = http.get(f"{BASE}/reinforcementFineTuningJobs/rc").json()
    assert job["state"] == "JOB_STATE_CANCELLED"
    _google_error(http.post(f"{BASE}/reinforcementFineTuningJobs/missing:cancel", json={}), 404, 5)


def test_cancel_after_completion_leaves_the_job_completed(
    http: httpx.Client, advance: Callable[[float], None]
) -> None:
    _create(http, "reinforcementFineTuningJobs", "late", RFT)
    advance(61)
    assert http.post(f"{BASE}/reinforcementFineTuningJobs/late:cancel", json={}).status_code == 200
    job = http.get(f"{BASE}/reinforcementFineTuningJobs/late").json()
    assert job["state"] == "JOB_STATE_COMPLETED"


# -- listing --------------------------------------------------------------------------------


def test_list_envelope_and_paging(http: httpx.Client) -> None:
    for n in range(120):
        _create(http, "dpoJobs", f"p{n:03d}", {"dataset": "d"})
    _create(http, "supervisedFineTuningJobs", "not-a-dpo", SFT)

    first = http.get(f"{BASE}/dpoJobs").json()
    assert set(first) == {"dpoJobs", "nextPageToken", "totalSize"}
    assert len(first["dpoJobs"]) == 50 and first["totalSize"] == 120
    names = [job["name"].rsplit("/", 1)[-1] for job in first["dpoJobs"]]
    assert names == [f"p{n:03d}" for n in range(50)]  # default order is by name

    seen = list(names)
    token = first["nextPageToken"]
    while token:
        page = http.get(f"{BASE}/dpoJobs", params={"pageSize": 50, "pageToken": token}).json()
        seen += [job["name"].rsplit("/", 1)[-1] for job in page["dpoJobs"]]
        token = page.get("nextPageToken")
        if token is None:
            assert "nextPageToken" not in page and len(page["dpoJobs"]) == 20
    assert seen == [f"p{n:03d}" for n in range(120)]

    capped = http.get(f"{BASE}/dpoJobs", params={"pageSize": 1000}).json()
    assert len(capped["dpoJobs"]) == 120 and "nextPageToken" not in capped
    empty = http.get(f"{BASE}/reinforcementFineTuningJobs").json()
    assert empty == {"reinforcementFineTuningJobs": [], "totalSize": 0}


def test_list_over_200_caps_pages(http: httpx.Client) -> None:
    for n in range(205):
        _create(http, "supervisedFineTuningJobs", f"s{n:03d}", SFT)
    page = http.get(f"{BASE}/supervisedFineTuningJobs", params={"pageSize": 500}).json()
    assert len(page["supervisedFineTuningJobs"]) == 200 and page["nextPageToken"]
    rest = http.get(
        f"{BASE}/supervisedFineTuningJobs",
        params={"pageSize": 500, "pageToken": page["nextPageToken"]},
    ).json()
    assert len(rest["supervisedFineTuningJobs"]) == 5 and "nextPageToken" not in rest


def test_list_tokens_survive_concurrent_deletes(http: httpx.Client) -> None:
    for n in range(6):
        _create(http, "dpoJobs", f"k{n}", {"dataset": "d"})
    first = http.get(f"{BASE}/dpoJobs", params={"pageSize": 3}).json()
    http.delete(f"{BASE}/dpoJobs/k0")
    second = http.get(
        f"{BASE}/dpoJobs", params={"pageSize": 3, "pageToken": first["nextPageToken"]}
    ).json()
    assert [j["name"][-2:] for j in second["dpoJobs"]] == ["k3", "k4", "k5"]


@pytest.mark.parametrize(
    "params", [{"pageSize": "-1"}, {"pageSize": "many"}, {"pageToken": "garbage!"}]
)
def test_list_bad_parameters(http: httpx.Client, params: dict[str, str]) -> None:
    _google_error(http.get(f"{BASE}/dpoJobs", params=params), 400, 3)


def test_page_token_is_bound_to_its_collection(http: httpx.Client) -> None:
    for n in range(3):
        _create(http, "dpoJobs", f"t{n}", {"dataset": "d"})
    token = http.get(f"{BASE}/dpoJobs", params={"pageSize": 1}).json()["nextPageToken"]
    _google_error(http.get(f"{BASE}/supervisedFineTuningJobs", params={"pageToken": token}), 400, 3)


# -- quota ----------------------------------------------------------------------------------


def test_quota_resource_shape(http: httpx.Client) -> None:
    quota = http.get(f"{BASE}/quotas/training-h200-count").json()
    assert set(quota) == {"name", "value", "maxValue", "usage", "updateTime"}
    assert quota["name"] == "accounts/sim-account/quotas/training-h200-count"
    assert (quota["value"], quota["maxValue"], quota["usage"]) == ("64", "64", 0)
    listed = http.get(f"{BASE}/quotas").json()
    # Listed with the account's other quotas, the same but for when it was read.
    [same] = [q for q in listed["quotas"] if q["name"] == quota["name"]]
    assert {**same, "updateTime": None} == {**quota, "updateTime": None}
    assert len(listed["quotas"]) > 1
    _google_error(http.get(f"{BASE}/quotas/training-x9-count"), 404, 5)


def test_sim_quota_control(http: httpx.Client, sim: Simulator) -> None:
    settings = http.post("/_sim/quota", json={"maxValue": 16}).json()
    assert (settings["maxValue"], settings["value"]) == (16, 16)
    assert settings["quota"]["maxValue"] == "16"
    settings = http.post(
        "/_sim/quota",
        json={"maxValue": 32, "value": 8, "external_usage": 5, "usage_lag_seconds": 2.5},
    ).json()
    assert (settings["maxValue"], settings["value"], settings["external_usage"]) == (32, 8, 5)
    assert settings["usage_lag_seconds"] == 2.5
    # Only external_usage changes; value stays where it was.
    settings = http.post("/_sim/quota", json={"external_usage": 0}).json()
    assert (settings["maxValue"], settings["value"], settings["external_usage"]) == (32, 8, 0)
    assert http.get("/_sim/quota").json() == settings
    assert sim.quota()["value"] == 8
    _google_error(http.post("/_sim/quota", json={"maxValue": -1}), 400, 3)
    _google_error(http.post("/_sim/quota", json={"maxValue": "10"}), 400, 3)
    _google_error(http.post("/_sim/quota", json={"maxvalue": 10}), 400, 3)


def test_usage_counts_gpus_of_running_jobs(
    http: httpx.Client, sim: Simulator, advance: Callable[[float], None]
) -> None:
    def usage() -> float:
        return float(http.get(f"{BASE}/quotas/training-h200-count").json()["usage"])

    http.post(
        f"{BASE}/supervisedFineTuningJobs",
        params={"supervisedFineTuningJobId": "h8"},
        json=SFT,
        headers={"X-Sftq-Gpu-Count": "8"},
    )
    _create(http, "dpoJobs", "default4", {"dataset": "d"})
    # acceleratorCount is no field of Fireworks' RFT body: refused, as Fireworks refuses it.
    refused = _create(http, "reinforcementFineTuningJobs", "hint",
                      {**RFT, "nodeCount": 2, "trainingConfig": {"acceleratorCount": 8}})
    assert "trainingConfig.acceleratorCount" in _google_error(refused, 400, 3)
    http.post(
        f"{BASE}/reinforcementFineTuningJobs",
        params={"reinforcementFineTuningJobId": "hint"},
        json={**RFT, "nodeCount": 2},
        headers={"X-Sftq-Gpu-Count": "16"},
    )
    assert usage() == 8 + 4 + 16
    sim.set_quota(external_usage=3)
    assert usage() == 31
    http.post(f"{BASE}/reinforcementFineTuningJobs/hint:cancel", json={})
    http.delete(f"{BASE}/dpoJobs/default4")
    assert usage() == 11
    advance(60)  # h8 completes
    assert usage() == 3
    jobs = http.get("/_sim/jobs").json()
    assert {(j["sim"]["kind"], j["sim"]["gpuCount"], j["sim"]["countsInUsage"]) for j in jobs} == {
        ("SFT", 8, False),
        ("RFT", 16, False),
    }


def test_usage_lag(http: httpx.Client, sim: Simulator, advance: Callable[[float], None]) -> None:
    sim.set_quota(usage_lag_seconds=5)
    _create(http, "dpoJobs", "lag", {"dataset": "d"})
    assert http.get(f"{BASE}/quotas/training-h200-count").json()["usage"] == 0
    assert sim.jobs()[0]["sim"]["countsInUsage"] is False
    advance(5)
    assert http.get(f"{BASE}/quotas/training-h200-count").json()["usage"] == 4
    assert sim.jobs()[0]["sim"]["countsInUsage"] is True


def test_creates_over_the_quota_are_counted_and_refused_when_enforced(
    http: httpx.Client, sim: Simulator, client: FireworksClient
) -> None:
    """The quota is judged on what the account really holds (the lag aside): a create with no
    room is counted always, and refused with 429 quota_exceeded only when enforced."""
    sim.set_quota(max_value=16, value=8, usage_lag_seconds=60, external_usage=2)
    assert _create(http, "dpoJobs", "fits", {"dataset": "d"}).status_code == 200  # 2 + 4 of 8
    quota = sim.quota()
    assert (quota["quota"]["usage"], quota["true_usage"], quota["over_quota_creates"]) == (2, 6, 0)
    # usage says 2 (the lag), but 6 of min(value, maxValue) = 8 are held: no room for 4.
    assert _create(http, "dpoJobs", "over", {"dataset": "d"}).status_code == 200
    assert sim.quota()["over_quota_creates"] == 1
    settings = http.post("/_sim/quota", json={"enforce_quota": True}).json()
    assert settings["enforce_quota"] is True and settings["true_usage"] == 10
    refused = _create(http, "dpoJobs", "refused", {"dataset": "d"})
    assert "quota_exceeded" in _google_error(refused, 429, 8)
    assert "refused" not in {j["name"].rsplit("/", 1)[-1] for j in sim.jobs()}  # not applied
    assert sim.quota()["over_quota_creates"] == 2
    # A retried create of a job that exists answers 409 first, never a quota refusal.
    assert _create(http, "dpoJobs", "fits", {"dataset": "d"}).status_code == 409
    # The provider client sees a transient failure (retry later), not a rejection.
    with pytest.raises(Transient) as raised:
        client.create_job("DPO", "refused", {"dataset": "d"}, gpu_count=1)
    assert raised.value.status == 429 and "quota_exceeded" in str(raised.value)
    http.delete(f"{BASE}/dpoJobs/over")
    http.delete(f"{BASE}/dpoJobs/fits")
    assert _create(http, "dpoJobs", "refused", {"dataset": "d"}).status_code == 200
    _google_error(http.post("/_sim/quota", json={"enforce_quota": "yes"}), 400, 3)
    sim.reset()
    assert (sim.quota()["enforce_quota"], sim.quota()["over_quota_creates"]) == (False, 0)


@pytest.mark.parametrize(
    ("payload", "header", "expected"),
    [
        ({}, None, 4),
        ({}, "12", 12),
        ({"acceleratorCount": 8, "nodeCount": 4}, "2", 2),
        ({"acceleratorCount": 8}, None, 8),
        ({"acceleratorCount": "8", "nodes": 2}, None, 16),
        ({"trainingConfig": {"acceleratorCount": 2, "nodeCount": 3}}, None, 6),
        ({"nodeCount": 3}, None, 4),
        ({"acceleratorCount": 0}, "zero", 4),
        ({"acceleratorCount": True}, "-3", 4),
    ],
)
def test_job_gpus(payload: dict[str, object], header: str | None, expected: int) -> None:
    assert job_gpus(payload, header) == expected


# -- control surface ------------------------------------------------------------------------


def test_requests_are_recorded_in_order(http: httpx.Client, server: SimulatorServer) -> None:
    _create(http, "dpoJobs", "r1", {"dataset": "d"})
    http.get(f"{BASE}/dpoJobs", params={"pageSize": "2"})
    http.delete(f"{BASE}/dpoJobs/r1")
    with httpx.Client(base_url=server.url, timeout=5.0) as keyless:
        keyless.get(f"{BASE}/quotas")
    http.get("/_sim/jobs")  # control paths are not recorded
    recorded = http.get("/_sim/requests").json()
    assert [(r["method"], r["path"], r["query"], r["body"]) for r in recorded] == [
        ("POST", f"{BASE}/dpoJobs", {"dpoJobId": "r1"}, {"dataset": "d"}),
        ("GET", f"{BASE}/dpoJobs", {"pageSize": "2"}, None),
        ("DELETE", f"{BASE}/dpoJobs/r1", {}, None),
        ("GET", f"{BASE}/quotas", {}, None),
    ]
    assert all(r["fault"] is None for r in recorded)
    assert http.delete("/_sim/requests").status_code == 200
    assert http.get("/_sim/requests").json() == []


def test_faults_apply_only_to_fireworks_paths(http: httpx.Client, sim: Simulator) -> None:
    settings = http.post("/_sim/faults", json={"error_rate": 1.0, "statuses": [503]}).json()
    assert settings["error_rate"] == 1.0 and settings["statuses"] == [503]
    _google_error(http.get(f"{BASE}/quotas"), 503, 14)
    assert http.get("/_sim/health").status_code == 200
    assert http.get("/_sim/faults").json() == settings
    assert http.get("/_sim/requests").json()[-1]["fault"] == "503"
    cleared = http.post("/_sim/faults", json={}).json()
    assert cleared["error_rate"] == 0 and cleared["timeout_rate"] == 0
    assert http.get(f"{BASE}/quotas").status_code == 200
    _google_error(http.post("/_sim/faults", json={"error_rate": 2}), 400, 3)
    _google_error(http.post("/_sim/faults", json={"statuses": [200]}), 400, 3)
    _google_error(http.post("/_sim/faults", json={"statuses": 500}), 400, 3)


def test_injected_429_has_retry_after(http: httpx.Client, sim: Simulator) -> None:
    sim.set_faults(error_rate=1.0, statuses=[429])
    response = http.get(f"{BASE}/dpoJobs")
    _google_error(response, 429, 8)
    assert response.headers["Retry-After"] == "1"


def test_faults_are_reproducible_with_a_seed() -> None:
    def run(seed: int) -> list[str | None]:
        sim = Simulator(seed=seed)
        sim.set_faults(error_rate=0.3, timeout_rate=0.0)
        with (
            SimulatorServer(sim) as srv,
            httpx.Client(
                base_url=srv.url, headers={"Authorization": "Bearer k"}, timeout=5.0
            ) as http,
        ):
            for _ in range(30):
                http.get(f"{BASE}/quotas")
        return [r["fault"] for r in sim.requests()]

    first = run(7)
    assert first == run(7)
    assert {"500", "503", "429"} & set(f for f in first if f) and None in first


def test_reset_restores_constructor_defaults(http: httpx.Client, sim: Simulator) -> None:
    _create(http, "dpoJobs", "r1", {"dataset": "d"})
    sim.set_quota(max_value=2, external_usage=1, usage_lag_seconds=9)
    sim.set_faults(latency_ms=1)
    sim.advance(100)
    assert http.post("/_sim/reset", json={}).status_code == 200
    assert sim.jobs() == [] and sim.requests() == []
    assert sim.faults()["latency_ms"] == 0
    quota = sim.quota()
    assert (quota["maxValue"], quota["value"], quota["external_usage"]) == (64, 64, 0)
    assert quota["usage_lag_seconds"] == 0


def test_advance_moves_simulated_time(http: httpx.Client) -> None:
    _create(http, "dpoJobs", "fast", {"dataset": "d"})
    assert http.post("/_sim/advance", json={"seconds": 61}).json() == {"offset_seconds": 61}
    assert http.get(f"{BASE}/dpoJobs/fast").json()["state"] == "JOB_STATE_COMPLETED"
    _google_error(http.post("/_sim/advance", json={"seconds": -1}), 400, 3)


def test_control_surface_errors(http: httpx.Client) -> None:
    _google_error(http.get("/_sim/nothing"), 404, 5)
    _google_error(http.post("/_sim/quota", content=b"[1]"), 400, 3)
    _google_error(http.post("/_sim/quota", content=b"{oops"), 400, 3)
    _google_error(http.get("/_sim/jobs/dpoJobs/x:finish"), 405, 12)


def test_value_below_max_value(server: SimulatorServer) -> None:
    sim = Simulator(max_value=64, value=40)
    assert sim.quota()["quota"]["value"] == "40"
    with pytest.raises(ValueError):
        Simulator(job_seconds=-1)


# -- concurrency and process lifecycle ------------------------------------------------------


def test_concurrent_creates_of_one_id_make_one_job(server: SimulatorServer) -> None:
    statuses: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def attempt() -> None:
        with httpx.Client(
            base_url=server.url, headers={"Authorization": "Bearer k"}, timeout=5.0
        ) as http:
            barrier.wait()
            status = _create(http, "dpoJobs", "race", {"dataset": "d"}).status_code
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200] + [409] * 7
    assert len(server.simulator.jobs()) == 1


def test_stop_releases_a_request_sleeping_in_an_injected_timeout() -> None:
    sim = Simulator()
    sim.set_faults(timeout_rate=1.0)  # the default 15 s sleep
    server = SimulatorServer(sim).start()
    errors: list[BaseException] = []

    def call() -> None:
        try:
            with httpx.Client(
                base_url=server.url, headers={"Authorization": "Bearer k"}, timeout=0.3
            ) as http:
                http.get(f"{BASE}/quotas")
        except httpx.TimeoutException as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    caller.join()
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2.0
    assert len(errors) == 1
    server.stop()  # idempotent


def test_url_needs_a_started_server() -> None:
    server = SimulatorServer()
    with pytest.raises(RuntimeError):
        _ = server.url


def _src_path() -> str:
    import sftq_server

    return str(Path(sftq_server.__file__).resolve().parent.parent)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_prints_its_url_and_exits_on_signal(sig: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": _src_path()}
    code = (
        "from sftq_server.simulator import serve; "
        "serve('127.0.0.1', 0, job_seconds=5, account_id='demo', max_value=8)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        assert line.startswith("simulator listening on http://127.0.0.1:")
        url = line.rsplit(" ", 1)[-1]
        with httpx.Client(base_url=url, headers={"Authorization": "Bearer k"}, timeout=5.0) as http:
            quota = http.get("/v1/accounts/demo/quotas/training-h200-count").json()
            assert quota["maxValue"] == "8"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err.decode()
        assert out == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_sdk_agrees_with_the_simulator(server: SimulatorServer) -> None:
    """Fireworks' own generated SDK, when installed, works against the simulator unchanged."""
    fireworks = pytest.importorskip("fireworks")
    sdk = fireworks.Fireworks(
        api_key="k", account_id="sim-account", base_url=server.url, max_retries=0
    )
    try:
        job = sdk.supervised_fine_tuning_jobs.create(
            supervised_fine_tuning_job_id="sdk-job", dataset="d", base_model="m"
        )
        assert job.name == "accounts/sim-account/supervisedFineTuningJobs/sdk-job"
        with pytest.raises(fireworks.ConflictError):
            sdk.supervised_fine_tuning_jobs.create(
                supervised_fine_tuning_job_id="sdk-job", dataset="d"
            )
        with pytest.raises(fireworks.BadRequestError):
            sdk.dpo_jobs.create(dpo_job_id="no-dataset", dataset="")
        for n in range(7):
            sdk.dpo_jobs.create(dpo_job_id=f"sdk-{n}", dataset="d")
        assert len(list(sdk.dpo_jobs.list(page_size=3))) == 7
        sdk.supervised_fine_tuning_jobs.delete("sdk-job")
        with pytest.raises(fireworks.NotFoundError):
            sdk.supervised_fine_tuning_jobs.get("sdk-job")
        sdk.reinforcement_fine_tuning_jobs.create(
            reinforcement_fine_tuning_job_id="sdk-rft",
            dataset="d",
            evaluator="e",
            inference_parameters={"response_candidates_count": 2},
        )
        sdk.reinforcement_fine_tuning_jobs.cancel("sdk-rft", body={})
        assert sdk.reinforcement_fine_tuning_jobs.get("sdk-rft").state == "JOB_STATE_CANCELLED"
    finally:
        sdk.close()
    assert json.dumps(server.simulator.requests())  # everything it sent was recorded as JSON
