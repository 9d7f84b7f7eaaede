"""The webhook routes over HTTP (jobs-api's WSGI app against a real database): answers,
validation messages, ownership (404, not 403), the cap of 10, the secret shown once, and the
destination checks of production mode, which must refuse before any connection is made."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from fn_support import Api, Db, assert_error
from wh_support import PUBLIC_IP, WEBHOOKS_KEY, FakeResolver, Receiver, secret_bytes

from sftq_server import webhooks
from sftq_server.core.settings import Settings

URL = "https://hooks.example.com/finetune"


def create(api: Api, key: str, **body: Any) -> Any:
    return api.post("/webhooks", key, json=body)


@pytest.fixture
def public(resolver: FakeResolver) -> FakeResolver:
    resolver.table["hooks.example.com"] = [PUBLIC_IP]
    return resolver


def test_create_answers_201_with_the_secret_once(api: Api, alice: str, public: Any) -> None:
    resp = create(api, alice, url=URL, description="ci")
    assert resp.status_code == 201, resp.get_data(as_text=True)
    body = resp.json
    assert set(body) >= {"id", "url", "events", "description", "enabled", "created_at", "secret"}
    assert body["url"] == URL and body["description"] == "ci" and body["enabled"] is True
    # The default: the three terminal types.
    assert body["events"] == ["job.succeeded", "job.failed", "job.cancelled"]
    assert resp.headers["Location"].endswith(f"/webhooks/{body['id']}")
    assert resp.headers["Cache-Control"] == "no-store"
    secret = body["secret"]
    assert len(secret_bytes(secret)) >= 24
    # Never again: not in the list, not in the endpoint, not after a test delivery.
    api.post(f"/webhooks/{body['id']}/test", alice)
    for path in ("/webhooks", f"/webhooks/{body['id']}", f"/webhooks/{body['id']}/deliveries"):
        again = api.get(path, alice)
        assert again.status_code == 200
        text = again.get_data(as_text=True)
        assert secret not in text and secret.removeprefix("whsec_") not in text
        assert "secret" not in text
    got = api.get(f"/webhooks/{body['id']}", alice).json
    assert {k: v for k, v in body.items() if k != "secret"} == got


def test_each_endpoint_gets_its_own_secret(api: Api, alice: str, public: Any) -> None:
    secrets = {create(api, alice, url=URL).json["secret"] for _ in range(3)}
    assert len(secrets) == 3


def test_events_are_kept_as_given_without_duplicates(api: Api, alice: str, public: Any) -> None:
    body = create(api, alice, url=URL, events=["job.*"]).json
    assert body["events"] == ["job.*"]
    body = create(api, alice, url=URL,
                  events=["job.failed", "job.queued", "job.failed", "job.admitted"]).json
    assert body["events"] == ["job.failed", "job.queued", "job.admitted"]


@pytest.mark.parametrize(("body", "code", "words"), [
    ({"url": "not a url"}, "invalid_url", "url"),
    ({"url": "hooks.example.com/x"}, "invalid_url", "https://"),
    ({"url": "ftp://hooks.example.com/x"}, "invalid_url", "https://"),
    ({"url": "https://"}, "invalid_url", "host"),
    ({"url": "https://user:pw@hooks.example.com/x"}, "invalid_url", "password"),
    ({"url": "https://hooks.example.com/x#frag"}, "invalid_url", "fragment"),
    ({"url": "https://hooks.example.com:99999/x"}, "invalid_url", "valid"),
    ({"url": "https://" + "a" * 2050 + ".com/"}, "invalid_url", "2048"),
    ({"url": 5}, "validation_error", "url must be a string"),
    ({}, "validation_error", "url is required"),
    ({"url": URL, "events": ["job.done"]}, "unknown_event", "job.done"),
    ({"url": URL, "events": []}, "validation_error", "must not be empty"),
    ({"url": URL, "events": "job.*"}, "validation_error", "events must be a list"),
    ({"url": URL, "events": [1]}, "validation_error", "events must be a list"),
    ({"url": URL, "description": "x" * 501}, "validation_error", "500"),
    ({"url": URL, "secret": "whsec_mine"}, "unknown_field", "secret"),
    ({"url": URL, "description": "a\u0000b"}, "validation_error", "NUL"),
])
def test_bad_input_answers_400_with_a_message(api: Api, alice: str, public: Any,
                                               body: dict[str, Any], code: str,
                                               words: str) -> None:
    err = assert_error(create(api, alice, **body), 400, code)
    assert words in err["error"], err


def test_bad_json_and_content_type(api: Api, alice: str) -> None:
    assert_error(api.post("/webhooks", alice, data="{", content_type="application/json"),
                 400, "invalid_json")
    assert_error(api.post("/webhooks", alice, data="[]", content_type="application/json"),
                 400, "validation_error")
    assert_error(api.post("/webhooks", alice, data="{}", content_type="text/plain"),
                 415, "unsupported_media_type")


def test_at_most_ten_endpoints_per_user(api: Api, alice: str, bob: str, public: Any) -> None:
    ids = [create(api, alice, url=URL).json["id"] for _ in range(10)]
    err = assert_error(create(api, alice, url=URL), 400, "too_many_webhooks")
    assert "10" in err["error"]
    assert create(api, bob, url=URL).status_code == 201  # per user, not global
    assert api.delete(f"/webhooks/{ids[0]}", alice).status_code == 204
    assert create(api, alice, url=URL).status_code == 201
    assert len(api.get("/webhooks", alice).json) == 10


def test_another_users_endpoint_is_not_found(api: Api, alice: str, bob: str,
                                             public: Any) -> None:
    mine = create(api, alice, url=URL).json["id"]
    for method, path in (("GET", f"/webhooks/{mine}"), ("DELETE", f"/webhooks/{mine}"),
                         ("POST", f"/webhooks/{mine}/test"),
                         ("GET", f"/webhooks/{mine}/deliveries")):
        assert_error(api.request(method, path, key=bob), 404, "not_found")
    assert api.get("/webhooks", bob).json == []
    assert api.get(f"/webhooks/{mine}", alice).status_code == 200  # untouched
    for bad in ("nope", str(uuid.uuid4()), mine.upper()[:-1] + "Z"):
        assert_error(api.get(f"/webhooks/{bad}", alice), 404, "not_found")


def test_delete_then_gone(api: Api, alice: str, public: Any) -> None:
    endpoint = create(api, alice, url=URL).json["id"]
    resp = api.delete(f"/webhooks/{endpoint}", alice)
    assert resp.status_code == 204 and resp.get_data() == b""
    assert_error(api.get(f"/webhooks/{endpoint}", alice), 404, "not_found")
    assert_error(api.delete(f"/webhooks/{endpoint}", alice), 404, "not_found")


def test_unauthenticated(api: Api) -> None:
    endpoint = str(uuid.uuid4())
    for method, path in (("POST", "/webhooks"), ("GET", "/webhooks"),
                         ("GET", f"/webhooks/{endpoint}"), ("DELETE", f"/webhooks/{endpoint}"),
                         ("POST", f"/webhooks/{endpoint}/test"),
                         ("GET", f"/webhooks/{endpoint}/deliveries")):
        body = {"json": {"url": URL}} if path == "/webhooks" and method == "POST" else {}
        assert_error(api.request(method, path, **body), 401, "unauthorized")
        assert_error(api.request(method, path, key="sftq_" + "0" * 48, **body), 401,
                     "unauthorized")


def test_test_delivery_is_queued_and_listed(api: Api, alice: str, public: Any) -> None:
    endpoint = create(api, alice, url=URL).json["id"]
    resp = api.post(f"/webhooks/{endpoint}/test", alice)
    assert resp.status_code == 202
    queued = resp.json
    assert queued["type"] == "webhook.test" and queued["outcome"] == "pending"
    assert queued["webhook_id"].startswith("msg_")
    listed = api.get(f"/webhooks/{endpoint}/deliveries", alice).json
    assert [d["webhook_id"] for d in listed] == [queued["webhook_id"]]
    assert listed[0] == queued | {"next_retry_at": listed[0]["next_retry_at"]}


def test_deliveries_query_is_checked(api: Api, alice: str, public: Any) -> None:
    endpoint = create(api, alice, url=URL).json["id"]
    for query in ("limit=0", "limit=201", "limit=x", "limit=1&limit=2", "page=2"):
        assert_error(api.get(f"/webhooks/{endpoint}/deliveries?{query}", alice), 400,
                     "validation_error")
    assert api.get(f"/webhooks/{endpoint}/deliveries?limit=200", alice).status_code == 200


def test_without_a_key_production_refuses_to_store_secrets(
        make_api: Callable[[Settings], Api], settings: Settings, alice: str,
        public: Any) -> None:
    import dataclasses

    api = make_api(dataclasses.replace(settings, webhooks_key=""))
    err = assert_error(create(api, alice, url=URL), 503, "webhooks_not_configured")
    assert "SFTQ_WEBHOOKS_KEY" in err["error"]
    bad = make_api(dataclasses.replace(settings, webhooks_key="short"))
    assert_error(create(bad, alice, url=URL), 503, "webhooks_not_configured")
    assert bad.get("/webhooks", alice).status_code == 200  # the rest still works


def test_secrets_are_sealed_at_rest(api: Api, db: Db, alice: str, public: Any) -> None:
    body = create(api, alice, url=URL).json
    stored = db.one("SELECT secret_sealed FROM sftq.webhook_endpoints WHERE id = %s", body["id"])
    raw = secret_bytes(body["secret"])
    assert stored.startswith("v1:")
    assert body["secret"] not in stored and body["secret"].removeprefix("whsec_") not in stored
    assert raw.hex() not in stored
    # It opens only with the key, and only for its own endpoint.
    box = webhooks.SecretBox(WEBHOOKS_KEY)
    assert box.open(stored, body["id"]) == body["secret"]
    with pytest.raises(webhooks.NotConfigured):
        box.open(stored, str(uuid.uuid4()))
    with pytest.raises(webhooks.NotConfigured):
        webhooks.SecretBox("another-key-" + "x" * 40).open(stored, body["id"])




# --- destinations ---------------------------------------------------------------------------

@pytest.fixture
def no_connections(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Fails the test if anything opens a TCP connection or asks the system resolver."""
    made: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        raise AssertionError(f"connection or resolution attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return made


@pytest.mark.parametrize("url", [
    "https://127.0.0.1/hook", "https://10.0.0.1/hook", "https://169.254.169.254/latest/meta-data",
    "https://localhost.example/hook", "https://[::1]/hook", "https://[::ffff:127.0.0.1]/hook",
    "https://192.168.1.20/hook", "https://172.16.0.1/hook", "https://100.64.0.1/hook",
    "https://0.0.0.0/hook", "https://[fd00:ec2::254]/hook", "https://[fe80::1]/hook",
    "https://224.0.0.1/hook", "https://metadata.google.internal/computeMetadata/v1/",
    "https://mixed.example/hook",
])
def test_production_refuses_private_destinations_before_connecting(
        api: Api, db: Db, alice: str, resolver: FakeResolver, url: str,
        no_connections: list[Any]) -> None:
    resolver.table.update({"localhost.example": ["127.0.0.1"],
                           "metadata.google.internal": ["169.254.169.254"],
                           "mixed.example": [PUBLIC_IP, "10.1.2.3"]})
    err = assert_error(create(api, alice, url=url), 400, "refused_destination")
    assert "refused" in err["error"]
    assert no_connections == []
    assert db.one("SELECT count(*) FROM sftq.webhook_endpoints") == 0


def test_production_refuses_loopback_receivers_even_when_one_listens(
        api: Api, alice: str, make_receiver: Callable[..., Receiver],
        resolver: FakeResolver) -> None:
    receiver = make_receiver()
    resolver.table["loopback.example"] = ["127.0.0.1"]
    for url in (f"https://127.0.0.1:{receiver.port}/hook",
                f"https://loopback.example:{receiver.port}/hook"):
        assert_error(create(api, alice, url=url), 400, "refused_destination")
    assert_error(create(api, alice, url=f"http://127.0.0.1:{receiver.port}/hook"), 400,
                 "invalid_url")
    assert receiver.connections == 0 and receiver.received == []


def test_production_refuses_http_and_names_that_do_not_resolve(api: Api, alice: str,
                                                              public: Any) -> None:
    err = assert_error(create(api, alice, url="http://hooks.example.com/x"), 400, "invalid_url")
    assert "https://" in err["error"]
    err = assert_error(create(api, alice, url="https://nowhere.example/x"), 400,
                       "refused_destination")
    assert "does not resolve" in err["error"]


def test_dev_mode_accepts_loopback_and_http(dev_api: Api, alice: str,
                                            no_connections: list[Any]) -> None:
    for url in ("http://127.0.0.1:9000/hook", "http://localhost:9000/hook",
                "https://10.0.0.1/hook"):
        resp = create(dev_api, alice, url=url)
        assert resp.status_code == 201, resp.get_data(as_text=True)
    assert no_connections == []  # dev mode does not even resolve at creation
    assert_error(create(dev_api, alice, url="ftp://127.0.0.1/x"), 400, "invalid_url")


def test_the_json_answers_are_the_documented_models(api: Api, alice: str, public: Any) -> None:
    from sftq_server.http.routes.webhooks import (
        WebhookDelivery,
        WebhookEndpoint,
        WebhookEndpointCreated,
    )

    created = create(api, alice, url=URL, events=["job.*"]).json
    WebhookEndpointCreated.model_validate(created)
    for item in api.get("/webhooks", alice).json:
        WebhookEndpoint.model_validate(item)
    WebhookDelivery.model_validate(api.post(f"/webhooks/{created['id']}/test", alice).json)
    for item in api.get(f"/webhooks/{created['id']}/deliveries", alice).json:
        WebhookDelivery.model_validate(item)
    assert json.loads(json.dumps(created))["id"] == created["id"]


def test_a_server_without_the_cryptography_package_answers_503(
        api: Api, alice: str, public: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    err = assert_error(create(api, alice, url=URL), 503, "webhooks_not_configured")
    assert "cryptography" in err["error"]
