"""Every answer of the webhook routes is one docs/openapi.json documents (status, body schema,
headers), and the pydantic models in api_webhooks.py agree with the document's schemas."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fn_support import Api, Db
from jsonschema import Draft202012Validator
from pydantic import BaseModel
from werkzeug.test import TestResponse
from wh_support import PUBLIC_IP, FakeResolver

from sftq_server.http.routes import webhooks as api_webhooks

SPEC: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text())
MODELS: dict[str, type[BaseModel]] = {
    "WebhookEndpoint": api_webhooks.WebhookEndpoint,
    "WebhookEndpointCreated": api_webhooks.WebhookEndpointCreated,
    "WebhookDelivery": api_webhooks.WebhookDelivery,
}


def resolve(obj: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in obj:
        _, section, name = obj["$ref"].removeprefix("#/").split("/")
        obj = SPEC["components"][section][name]
    return obj


def validator(schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator({**schema, "components": SPEC["components"]},
                                format_checker=Draft202012Validator.FORMAT_CHECKER)


seen: set[tuple[str, str, int]] = set()


def check(resp: TestResponse, method: str, template: str) -> None:
    op = SPEC["paths"][template][method.lower()]
    status = resp.status_code
    assert str(status) in op["responses"], (method, template, status, resp.get_data())
    documented = resolve(op["responses"][str(status)])
    if "content" not in documented:
        assert resp.get_data() == b""
    else:
        schema = documented["content"]["application/json"]["schema"]
        validator(schema).validate(resp.json)
        name = schema.get("$ref", "").rsplit("/", 1)[-1] or \
            schema.get("items", {}).get("$ref", "").rsplit("/", 1)[-1]
        if name in MODELS:
            for item in (resp.json if isinstance(resp.json, list) else [resp.json]):
                MODELS[name].model_validate(item)
    for header in documented.get("headers", {}):
        assert header in resp.headers, (template, status, header)
    seen.add((method, template, status))


def test_every_webhook_answer_is_documented(api: Api, db: Db, alice: str, bob: str,
                                            resolver: FakeResolver) -> None:
    resolver.table["hooks.example.com"] = [PUBLIC_IP]
    W, WID, WT, WD = ("/webhooks", "/webhooks/{id}", "/webhooks/{id}/test",  # noqa: N806
                      "/webhooks/{id}/deliveries")
    created = api.post(W, alice, json={"url": "https://hooks.example.com/x", "events": ["job.*"]})
    check(created, "POST", W)
    eid = created.json["id"]
    for body in ({"url": "https://127.0.0.1/"}, {"url": "x"}, {"url": "https://h.example/",
                                                                "events": ["no"]}):
        check(api.post(W, alice, json=body), "POST", W)
    check(api.post(W, alice, data="{}", content_type="text/plain"), "POST", W)
    check(api.post(W, json={"url": "https://hooks.example.com/x"}), "POST", W)
    check(api.get(W, alice), "GET", W)
    check(api.get(W), "GET", W)
    api.enqueue(alice)
    for key, target in ((alice, eid), (bob, eid), (alice, str(uuid.uuid4())), (alice, "x")):
        check(api.get(f"/webhooks/{target}", key), "GET", WID)
        check(api.post(f"/webhooks/{target}/test", key), "POST", WT)
        check(api.get(f"/webhooks/{target}/deliveries", key), "GET", WD)
    check(api.get(f"/webhooks/{eid}/deliveries?limit=0", alice), "GET", WD)
    db.conn.execute("SELECT sftq._webhook_disable(%s, 'gone', now())", (eid,))
    check(api.post(f"/webhooks/{eid}/test", alice), "POST", WT)
    check(api.delete(f"/webhooks/{eid}", bob), "DELETE", WID)
    check(api.delete(f"/webhooks/{eid}", alice), "DELETE", WID)
    expected = {("POST", W, s) for s in (201, 400, 401, 415)} | {("GET", W, 200), ("GET", W, 401)} \
        | {("GET", WID, s) for s in (200, 404)} | {("DELETE", WID, s) for s in (204, 404)} \
        | {("POST", WT, s) for s in (202, 404, 409)} | {("GET", WD, s) for s in (200, 400, 404)}
    assert expected <= seen, expected - seen


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_and_schemas_name_the_same_fields(name: str) -> None:
    schema = SPEC["components"]["schemas"][name]
    assert set(schema["properties"]) == set(MODELS[name].model_fields)
    assert set(schema["required"]) == set(MODELS[name].model_fields)
    MODELS[name].model_validate(schema["example"])
