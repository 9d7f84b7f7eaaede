"""docs/openapi.json is a valid OpenAPI 3.1 document, names exactly the routes the server has,
and every answer the server gives (success or error) is one it documents: status, body schema,
headers. The pydantic response models are held to the same bodies."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fn_support import Api, Db, FakeProvider
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from pydantic import BaseModel
from werkzeug.test import Client, TestResponse

from sftq_server.core.errors import Unavailable
from sftq_server.core.settings import Settings
from sftq_server.http import models as models
from sftq_server.http.apps import ApiApp, make_jobs_api
from sftq_server.http.web import wsgi_app
from sftq_server.provider import Transient

SPEC_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
SPEC: dict[str, Any] = json.loads(SPEC_PATH.read_text())
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}

# Which pydantic model mirrors each component schema.
MODELS: dict[str, type[BaseModel]] = {
    "SubmitResponse": models.SubmitResponse, "Job": models.Job,
    "CancelAccepted": models.CancelAccepted, "QueueContext": models.QueueContext,
    "Summary": models.Summary, "JobAnalytics": models.JobAnalytics, "Health": models.Health,
    "Error": models.Error, "RetryResponse": models.RetryResponse,
}


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(SPEC)
    assert SPEC["openapi"].startswith("3.1.")


def test_the_server_serves_the_document_as_is(api: Api) -> None:
    resp = api.get("/openapi.json")
    assert resp.status_code == 200 and resp.content_type == "application/json"
    assert resp.get_data() == SPEC_PATH.read_bytes()


def test_the_document_names_exactly_the_routes_the_server_has(jobs_app: ApiApp) -> None:
    served = {(r.template, m.lower()) for r in jobs_app.router.routes for m in r.handlers}
    documented = {(path, m) for path, item in SPEC["paths"].items() for m in item if m in METHODS}
    assert served == documented


def test_the_document_covers_what_the_brief_lists() -> None:
    schemas = SPEC["components"]["schemas"]
    for name in ("Job", "SubmitRequest", "SubmitResponse", "QueueContext", "Summary",
                 "JobAnalytics", "Error"):
        assert name in schemas
    assert SPEC["components"]["securitySchemes"]["bearerAuth"] == {
        **SPEC["components"]["securitySchemes"]["bearerAuth"], "type": "http", "scheme": "bearer"}
    text = json.dumps(SPEC)
    for header in ("Idempotency-Key", "X-Next-Cursor", "Retry-After", "Idempotent-Replayed",
                   "WWW-Authenticate", "Location", "Link"):
        assert header in text
    assert SPEC["paths"]["/health"]["get"]["security"] == []
    assert SPEC["paths"]["/openapi.json"]["get"]["security"] == []


def schema_validator(schema: dict[str, Any]) -> Draft202012Validator:
    # Refs in the document are "#/components/...": give them the document's components as root.
    return Draft202012Validator({**schema, "components": SPEC["components"]},
                                format_checker=Draft202012Validator.FORMAT_CHECKER)


def resolve(obj: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in obj:
        _, section, name = obj["$ref"].removeprefix("#/").split("/")
        obj = SPEC["components"][section][name]
    return obj


class Conformance:
    """Checks each answer against the operation the document gives for it."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str, int]] = set()

    def check(self, resp: TestResponse, method: str, template: str) -> None:
        status = resp.status_code
        item = SPEC["paths"].get(template)
        op = item.get(method.lower()) if item else None
        if op is None:
            # Not a documented operation: only the two generic answers are possible.
            assert status in (404, 405), (method, template, status)
            schema_validator({"$ref": "#/components/schemas/Error"}).validate(resp.json)
            if status == 405:
                assert resp.headers["Allow"]
            return
        documented = op["responses"]
        assert str(status) in documented, (method, template, status, resp.get_data(as_text=True))
        response = resolve(documented[str(status)])
        schema = response["content"]["application/json"]["schema"]
        schema_validator(schema).validate(resp.json)
        for name, header in response.get("headers", {}).items():
            header = resolve(header)
            if name in resp.headers:
                schema_validator(header["schema"]).validate(
                    int(resp.headers[name]) if header["schema"].get("type") == "integer"
                    else resp.headers[name])
        if status == 201:
            assert "Location" in resp.headers
        if status == 401:
            assert resp.headers["WWW-Authenticate"] == "Bearer"
        if status == 503:
            assert "Retry-After" in resp.headers
        if "X-Next-Cursor" in resp.headers:
            assert "Link" in resp.headers
        model_name = schema.get("$ref", "").rsplit("/", 1)[-1]
        if model_name in MODELS:
            MODELS[model_name].model_validate(resp.json)
        elif schema.get("type") == "array":
            for item_body in resp.json:  # type: ignore[union-attr]
                models.Job.model_validate(item_body)
        self.seen.add((method.upper(), template, status))


@pytest.fixture
def conformance() -> Conformance:
    return Conformance()


def test_every_answer_conforms(api: Api, db: Db, alice: str, bob: str, provider: FakeProvider,
                               conformance: Conformance, settings: Settings) -> None:
    c = conformance.check
    J, JID, JA = "/jobs", "/jobs/{id}", "/jobs/{id}/analytics"  # noqa: N806
    Q, S = "/jobs/analytics/queue", "/jobs/analytics/summary"  # noqa: N806
    # POST /jobs: 201, replay, 400 (each code), 401, 409, 413, 415.
    first = api.submit(alice, display_name="a", headers={"Idempotency-Key": "k1"})
    c(first, "POST", J)
    c(api.submit(alice, display_name="a", headers={"Idempotency-Key": "k1"}), "POST", J)
    c(api.submit(alice, display_name="b", headers={"Idempotency-Key": "k1"}), "POST", J)
    for bad in ({"kind": "SFT"}, {"kind": "SFT", "fireworks_payload": {}, "x": 1},
                {"kind": "X", "fireworks_payload": {}}):
        c(api.post(J, alice, json=bad), "POST", J)
    c(api.post(J, alice, data="{", content_type="application/json"), "POST", J)
    c(api.post(J, alice, data="{}", content_type="text/plain"), "POST", J)
    c(api.post(J, alice, data="x" * (settings.max_body_bytes + 1),
               content_type="application/json"), "POST", J)
    c(api.submit("sftq_" + "0" * 48), "POST", J)
    c(api.post(J), "POST", J)
    # GET /jobs: 200 with and without a next page, 400, 401.
    for _ in range(2):
        api.enqueue(alice, "DPO")
    c(api.get(J, alice), "GET", J)
    c(api.get(J + "?limit=1&kind=DPO", alice), "GET", J)
    c(api.get(J + "?limit=0", alice), "GET", J)
    c(api.get(J + "?bogus=1", alice), "GET", J)
    c(api.get(J), "GET", J)
    # GET /jobs/{id}: 200, 404 (other user, unknown, malformed), 401.
    job_id = first.json["id"]  # type: ignore[index]
    for key, target in ((alice, job_id), (bob, job_id), (alice, str(uuid.uuid4())),
                        (alice, "nope"), (None, job_id)):
        c(api.get(f"/jobs/{target}", key), "GET", JID)
        c(api.get(f"/jobs/{target}/analytics", key), "GET", JA)
    # Analytics: 200 and 401; the summary with finished jobs too.
    running = api.enqueue(bob)
    db.admit()
    db.submitted(running)
    db.provider_state(running, "JOB_STATE_FAILED", "boom", after=60)
    for path in (Q, S):
        c(api.get(path, alice), "GET", path)
        c(api.get(path, bob), "GET", path)
        c(api.get(path), "GET", path)
    c(api.get(f"/jobs/{running}/analytics", bob), "GET", JA)
    # DELETE: 200 (queued), 200 (running), 202 (provider down), 409, 404, 401.
    queued = api.enqueue(bob)
    c(api.delete(f"/jobs/{queued}", bob), "DELETE", JID)
    c(api.delete(f"/jobs/{queued}", bob), "DELETE", JID)
    c(api.delete(f"/jobs/{queued}", alice), "DELETE", JID)
    c(api.delete(f"/jobs/{queued}"), "DELETE", JID)
    c(api.delete(f"/jobs/{job_id}", alice), "DELETE", JID)  # alice's first job, now admitted
    carol = db.user("carol")
    for fail in (Transient("down"), None):
        jid = api.enqueue(carol)
        db.admit()
        db.submitted(jid)
        provider.fail = fail
        c(api.delete(f"/jobs/{jid}", carol), "DELETE", JID)
    # Health, the document, and the generic 404/405.
    c(api.get("/health"), "GET", "/health")
    c(api.get("/openapi.json"), "GET", "/openapi.json")
    c(api.get("/nowhere", alice), "GET", "/nowhere")
    c(api.request("PUT", J, key=alice), "PUT", J)
    c(api.request("POST", "/health"), "POST", "/health")

    statuses = {(m, t): s for m, t, s in conformance.seen}
    assert len(statuses) >= 9
    expected = {("POST", J, s) for s in (201, 400, 401, 409, 413, 415)} | \
        {("GET", J, s) for s in (200, 400, 401)} | \
        {("GET", JID, s) for s in (200, 401, 404)} | \
        {("DELETE", JID, s) for s in (200, 202, 401, 404, 409)} | \
        {("GET", JA, s) for s in (200, 401, 404)} | \
        {("GET", Q, 200), ("GET", S, 200), ("GET", "/health", 200), ("GET", "/openapi.json", 200)}
    assert expected <= conformance.seen, expected - conformance.seen


class FailingDb:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def fetchone(self, *args: Any) -> Any:
        raise self.exc

    fetchall = fetchone  # POST /jobs goes through the group commit's fetchall

    def close(self) -> None:
        pass


@pytest.mark.parametrize("exc", [Unavailable("down", headers={"Retry-After": "5"}),
                                 RuntimeError("bug")])
def test_server_side_failures_conform(settings: Settings, conformance: Conformance,
                                      alice: str, exc: Exception) -> None:
    api = Api(Client(wsgi_app(make_jobs_api(settings, db=FailingDb(exc)))))  # type: ignore[arg-type]
    job = str(uuid.uuid4())
    for method, path, template in [
        ("GET", "/health", "/health"), ("GET", "/jobs", "/jobs"), ("POST", "/jobs", "/jobs"),
        ("GET", f"/jobs/{job}", "/jobs/{id}"), ("DELETE", f"/jobs/{job}", "/jobs/{id}"),
        ("GET", "/jobs/analytics/queue", "/jobs/analytics/queue"),
        ("GET", "/jobs/analytics/summary", "/jobs/analytics/summary"),
        ("GET", f"/jobs/{job}/analytics", "/jobs/{id}/analytics"),
    ]:
        kwargs: dict[str, Any] = {"key": alice}
        if method == "POST":
            kwargs["json"] = {"kind": "SFT", "fireworks_payload": {}}
        resp = api.request(method, path, **kwargs)
        assert resp.status_code == (503 if isinstance(exc, Unavailable) else 500)
        conformance.check(resp, method, template)


@pytest.mark.parametrize(("body", "accepted"), [
    ({"kind": "SFT", "fireworks_payload": {}}, True),
    ({"kind": "RFT", "fireworks_payload": {"a": [1]}, "gpu_count": 64, "display_name": None}, True),
    ({"kind": "DPO", "fireworks_payload": {}, "display_name": "x" * 256, "gpu_count": 1}, True),
    ({"kind": "SFT"}, False),
    ({"fireworks_payload": {}}, False),
    ({"kind": "SFT", "fireworks_payload": None}, False),
    ({"kind": "SFT", "fireworks_payload": []}, False),
    # Any case (issue 18.6), ASCII letters only: U+017F (long s) upper-cases to "S" in Python.
    ({"kind": "sft", "fireworks_payload": {}}, True),
    ({"kind": "dPo", "fireworks_payload": {}}, True),
    ({"kind": "\u017fft", "fireworks_payload": {}}, False),
    ({"kind": "sft ", "fireworks_payload": {}}, False),
    ({"kind": "SFT", "fireworks_payload": {}, "gpu_count": 65}, False),
    ({"kind": "SFT", "fireworks_payload": {}, "gpu_count": "4"}, False),
    ({"kind": "SFT", "fireworks_payload": {}, "display_name": "x" * 257}, False),
    ({"kind": "SFT", "fireworks_payload": {}, "extra": 1}, False),
])
def test_submit_request_schema_agrees_with_the_server(api: Api, alice: str, body: dict[str, Any],
                                                      accepted: bool) -> None:
    schema_ok = schema_validator({"$ref": "#/components/schemas/SubmitRequest"}).is_valid(body)
    status = api.post("/jobs", alice, json=body).status_code
    assert schema_ok is accepted
    assert (status == 201) is accepted, status


def test_a_kind_in_any_case_is_answered_in_upper_case(api: Api, alice: str) -> None:
    # Issue 18.6: the body may say "sft"; the job is SFT, and every answer spells it so.
    resp = api.post("/jobs", alice, json={"kind": "sft", "fireworks_payload": {}})
    assert resp.status_code == 201, resp.get_data(as_text=True)
    assert resp.json["kind"] == "SFT"
    assert api.get(f"/jobs/{resp.json['id']}", alice).json["kind"] == "SFT"
