"""The pre-flight shape check (issue 44, item 1) through real HTTP: POST /jobs refuses a payload
bound to fail at Fireworks before it waits, accepts a doubtful one with warnings, and
POST /jobs:validate reports the same findings without enqueueing anything."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from fn_support import Db

from sftq_server.core.settings import Settings
from sftq_server.http.gateway import make_server
from sftq_server.http.models import SubmitResponse, ValidateResponse
from sftq_server.preflight.schema import SCHEMA_FILE, generate

SFT = {"dataset": "accounts/a/datasets/d", "baseModel": "accounts/fireworks/models/m"}


@pytest.fixture
def base(db_url: str) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, Settings(database_url=db_url, preflight=True))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}/functions/v1/jobs-api"
    finally:
        server.shutdown()
        server.server_close()
        server.app.close()


@pytest.fixture
def key(db: Db) -> str:
    return db.user("alice")


def post(base: str, key: str, body: dict[str, Any], path: str = "/jobs") -> httpx.Response:
    return httpx.post(base + path, json=body, headers={"Authorization": f"Bearer {key}"})


def count_jobs(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM sftq.jobs").fetchone()
        assert row is not None
        return int(row[0])


def test_a_misspelt_field_is_a_400_with_its_path_and_the_fix(base: str, key: str,
                                                             db_url: str) -> None:
    answer = post(base, key, {"kind": "SFT", "fireworks_payload": {**SFT, "learningrate": 1e-4}})
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["code"] == "invalid_fireworks_payload"
    assert "did you mean 'learningRate'" in body["error"]
    assert body["details"] == [{"path": "fireworks_payload.learningrate",
                                "message": "unknown field 'learningrate' in fireworks_payload: "
                                           "did you mean 'learningRate'?"}]
    assert count_jobs(db_url) == 0


@pytest.mark.parametrize(("kind", "payload", "path", "words"), [
    ("SFT", {"baseModel": "m"}, "fireworks_payload.dataset", "is required for kind SFT"),
    ("RFT", {"dataset": "d"}, "fireworks_payload.evaluator", "is required for kind RFT"),
    ("SFT", {**SFT, "epochs": "two"}, "fireworks_payload.epochs", "must be an integer"),
    ("SFT", {**SFT, "maxContextLength": 1000}, "fireworks_payload.maxContextLength",
     "multiple of 16"),
    ("DPO", {"dataset": "d", "trainingConfig": {"maxContextLength": 100}},
     "fireworks_payload.trainingConfig.maxContextLength", "multiple of 16"),
    ("RFT", {"dataset": "d", "evaluator": "e",
             "inferenceParameters": {"responseCandidatesCount": 1}},
     "fireworks_payload.inferenceParameters.responseCandidatesCount", "at least 2"),
    ("SFT", {**SFT, "warmStartFrom": "w"}, "fireworks_payload.warmStartFrom", "only one of"),
    ("SFT", {**SFT, "wandbConfig": {"enabled": "yes"}}, "fireworks_payload.wandbConfig.enabled",
     "must be true or false"),
])
def test_definite_errors_per_kind(base: str, key: str, kind: str, payload: dict[str, Any],
                                  path: str, words: str) -> None:
    answer = post(base, key, {"kind": kind, "fireworks_payload": payload})
    assert answer.status_code == 400, answer.text
    details = answer.json()["details"]
    assert answer.json()["code"] == "invalid_fireworks_payload"
    assert any(d["path"] == path and words in d["message"] for d in details), details


def test_a_doubtful_field_is_enqueued_with_warnings_and_a_valid_one_without(
        base: str, key: str, db_url: str) -> None:
    doubtful = post(base, key, {"kind": "SFT", "fireworks_payload": {**SFT, "brandNewKnob": 3}})
    assert doubtful.status_code == 201, doubtful.text
    body = SubmitResponse.model_validate(doubtful.json())
    assert body.state == "QUEUED" and body.warnings is not None
    assert [w.path for w in body.warnings] == ["fireworks_payload.brandNewKnob"]
    assert "not in Fireworks' SFT schema" in body.warnings[0].message
    plain = post(base, key, {"kind": "sft", "fireworks_payload": {**SFT, "epochs": 2,
                                                                  "learningRate": 1e-4}})
    assert plain.status_code == 201 and "warnings" not in plain.json()
    assert count_jobs(db_url) == 2


def test_validate_off_skips_the_check(base: str, key: str) -> None:
    answer = post(base, key, {"kind": "SFT", "validate": "off", "fireworks_payload": {}})
    assert answer.status_code == 201, answer.text
    bad = post(base, key, {"kind": "SFT", "validate": "no", "fireworks_payload": SFT})
    assert bad.status_code == 400 and "validate must be" in bad.json()["error"]


def test_validate_route_reports_and_enqueues_nothing(base: str, key: str, db_url: str) -> None:
    answer = post(base, key, {"kind": "RFT", "fireworks_payload": {"dataset": "d", "x": 1}},
                  path="/jobs:validate")
    assert answer.status_code == 200, answer.text
    body = ValidateResponse.model_validate(answer.json())
    assert not body.valid and [e.path for e in body.errors] == ["fireworks_payload.evaluator"]
    assert [w.path for w in body.warnings] == ["fireworks_payload.x"]
    assert body.schema_version.startswith("fireworks-ai ")
    good = post(base, key, {"kind": "SFT", "fireworks_payload": SFT}, path="/jobs:validate")
    assert good.json()["valid"] is True and good.json()["errors"] == []
    assert count_jobs(db_url) == 0
    denied = httpx.post(base + "/jobs:validate", json={"kind": "SFT", "fireworks_payload": SFT})
    assert denied.status_code == 401


def test_the_typo_400_is_answered_in_under_50_ms(base: str, key: str) -> None:
    body = {"kind": "SFT", "fireworks_payload": {**SFT, "learningrate": 1e-4}}
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}) as client:
        client.post(base + "/jobs", json=body)  # warm: the pool's first connection
        times = []
        for _ in range(30):
            started = time.perf_counter()
            assert client.post(base + "/jobs", json=body).status_code == 400
            times.append(time.perf_counter() - started)
    assert statistics.median(times) < 0.050, times


def test_the_checked_in_schema_is_the_sdks() -> None:
    pytest.importorskip("fireworks")
    assert json.loads(SCHEMA_FILE.read_text()) == json.loads(json.dumps(generate())), \
        "run `python -m sftq_server.preflight.schema` to regenerate fireworks_schema.json"


def test_the_client_and_the_cli_dry_run(base: str, key: str, db_url: str, tmp_path: Any,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from sftq_client import AsyncClient, BadRequest, Client
    from sftq_client.cli import main

    with Client(key, base) as client:
        checked = client.validate("SFT", {**SFT, "learningrate": 1})
        assert not checked.valid and checked.errors[0].path == "fireworks_payload.learningrate"
        with pytest.raises(BadRequest) as refused:
            client.submit("SFT", {**SFT, "learningrate": 1})
        assert refused.value.code == "invalid_fireworks_payload"
        accepted = client.submit("SFT", {**SFT, "someNewField": 1})
        assert [w.path for w in accepted.warnings] == ["fireworks_payload.someNewField"]
        assert client.submit("SFT", {}, validate=False).state == "QUEUED"

    import asyncio

    async def use_async() -> bool:
        async with AsyncClient(key, base) as client:
            return (await client.validate("RFT", {"dataset": "d", "evaluator": "e"})).valid

    assert asyncio.run(use_async()) is True
    assert count_jobs(db_url) == 2

    bad = tmp_path / "sft.json"
    bad.write_text(json.dumps({**SFT, "learningrate": 1}))
    common = ["--api-url", base, "--api-key", key]
    assert main(["submit", *common, "--payload", str(bad), "--dry-run"]) == 7
    printed = capsys.readouterr().out
    assert "did you mean 'learningRate'?" in printed and "would be refused" in printed
    good = tmp_path / "good.json"
    good.write_text(json.dumps(SFT))
    assert main(["submit", *common, "--kind", "sft", "--payload", str(good), "--dry-run"]) == 0
    assert "would be accepted" in capsys.readouterr().out
    assert count_jobs(db_url) == 2


def test_every_problem_is_in_one_answer(base: str, key: str, db_url: str) -> None:
    """Issue 54.13: a bad gpu_count and a misspelt payload field are both named in the one 400,
    each detail with its `path` (the request's own fields keep `field` too)."""
    answer = post(base, key, {"kind": "sft", "gpu_count": 10000, "display_name": 7,
                              "fireworks_payload": {**SFT, "learningrate": 1e-4}})
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["code"] == "validation_error"
    paths = [d["path"] for d in body["details"]]
    assert paths == ["display_name", "gpu_count", "fireworks_payload.learningrate"]
    assert all(d["message"] for d in body["details"])
    assert [d["field"] for d in body["details"]] == ["display_name", "gpu_count",
                                                     "fireworks_payload"]
    assert "gpu_count must be" in body["error"] and "did you mean 'learningRate'" in body["error"]
    # The same through POST /jobs:validate, and nothing enqueued by either.
    again = post(base, key, {"kind": "SFT", "gpu_count": 0,
                             "fireworks_payload": {"baseModel": "m"}}, "/jobs:validate")
    assert [d["path"] for d in again.json()["details"]] == ["gpu_count",
                                                            "fireworks_payload.dataset"]
    # validate "off" turns the payload's check off here too.
    off = post(base, key, {"kind": "SFT", "gpu_count": 0, "validate": "off",
                           "fireworks_payload": {"baseModel": "m"}})
    assert [d["path"] for d in off.json()["details"]] == ["gpu_count"]
    assert count_jobs(db_url) == 0
