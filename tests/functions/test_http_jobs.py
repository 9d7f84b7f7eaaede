"""jobs-api over HTTP: auth, POST /jobs validation and idempotency, listing and paging,
GET one job, routing (404/405), and the 404-not-403 rule between users."""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import pytest
from fn_support import SFT_PAYLOAD, Api, Db, assert_error
from werkzeug.test import Client

from sftq_server.core.settings import Settings
from sftq_server.http.apps import make_jobs_api
from sftq_server.http.web import wsgi_app

JOB_KEYS = {"id", "kind", "state", "display_name", "gpu_count", "created_at", "started_at",
            "completed_at", "error", "fireworks_job_name",
            # Added since the contract (new fields are only added): issue 10.
            "failure_class", "retry_of", "warnings", "estimated_cost",
            # Issue 53: pipelines and run limits.
            "after", "max_run_seconds", "stalled", "stalled_since"}


def post_raw(api: Api, key: str | None, data: bytes | str, *,
             content_type: str | None = "application/json", **headers: str) -> Any:
    hdrs = dict(headers)
    if content_type is not None:
        hdrs["Content-Type"] = content_type
    return api.post("/jobs", key, data=data, headers=hdrs)


# --- auth ---------------------------------------------------------------------------------

class NoDb:
    """A database that must not be called: the web layer refuses these requests by itself."""

    def fetchone(self, *args: Any) -> Any:
        raise AssertionError("the database was called")

    def close(self) -> None:
        pass


@pytest.fixture
def no_db_api() -> Api:
    settings = Settings(database_url="postgresql://unused.invalid/none")
    return Api(Client(wsgi_app(make_jobs_api(settings, db=NoDb()))))  # type: ignore[arg-type]


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Bearer ", "Basic c2Z0cTpzZWNyZXQ=", "Token sftq_0123456789abcdef",
    "Bearer notakey0123456789", "Bearer sftq_", "Bearer sftq_short", "Bearer sftq_has space in it",
    "Bearer sftq_" + "a" * 300, "Bearer sftq_0123456789abcdef;DROP",
])
def test_malformed_auth_is_401_without_a_database_call(no_db_api: Api,
                                                       authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in [("GET", "/jobs"), ("POST", "/jobs"), ("GET", f"/jobs/{uuid.uuid4()}"),
                         ("DELETE", f"/jobs/{uuid.uuid4()}"), ("GET", "/jobs/analytics/queue"),
                         ("GET", "/jobs/analytics/summary"),
                         ("GET", f"/jobs/{uuid.uuid4()}/analytics")]:
        resp = no_db_api.request(method, path, headers=headers)
        assert_error(resp, 401, "unauthorized")
        assert resp.headers["WWW-Authenticate"] == "Bearer"


def test_unknown_and_revoked_keys_are_401(api: Api, db: Db, alice: str) -> None:
    unknown = "sftq_" + "0" * 48
    resp = api.get("/jobs", unknown)
    assert_error(resp, 401, "unauthorized")
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert api.get("/jobs", alice).status_code == 200
    db.one("SELECT sftq.revoke_key(%s)", alice[:13])
    for resp in (api.get("/jobs", alice), api.submit(alice),
                 api.get("/jobs/analytics/summary", alice)):
        assert_error(resp, 401, "unauthorized")
        assert resp.headers["WWW-Authenticate"] == "Bearer"


def test_auth_scheme_is_case_insensitive(api: Api, alice: str) -> None:
    assert api.get("/jobs", headers={"Authorization": f"bearer {alice}"}).status_code == 200


def test_health_and_openapi_need_no_key(api: Api) -> None:
    assert api.get("/health").status_code == 200
    resp = api.get("/openapi.json")
    assert resp.status_code == 200
    assert resp.json["openapi"].startswith("3.1")  # type: ignore[index]


# --- POST /jobs ---------------------------------------------------------------------------

def test_submit_answers_201_with_exactly_the_contract_fields(api: Api, alice: str) -> None:
    resp = api.submit(alice, "SFT", display_name="qwen3-14b baseline", gpu_count=8)
    assert resp.status_code == 201
    body = resp.json
    assert set(body) == {"id", "kind", "state", "created_at"}  # type: ignore[arg-type]
    assert body["kind"] == "SFT" and body["state"] == "QUEUED"  # type: ignore[index]
    uuid.UUID(body["id"])  # type: ignore[index]
    assert body["created_at"].endswith("Z")  # type: ignore[index]
    assert resp.headers["Location"] == f"/jobs/{body['id']}"  # type: ignore[index]
    assert "Idempotent-Replayed" not in resp.headers
    job = api.get(f"/jobs/{body['id']}", alice).json  # type: ignore[index]
    assert set(job) == JOB_KEYS  # type: ignore[arg-type]
    assert job["display_name"] == "qwen3-14b baseline" and job["gpu_count"] == 8  # type: ignore[index]


@pytest.mark.parametrize("kind", ["SFT", "DPO", "RFT"])
def test_every_kind_is_accepted_and_gpu_count_defaults_to_4(sapi: Api, skey: str,
                                                            kind: str) -> None:
    job_id = sapi.enqueue(skey, kind)
    job = sapi.get(f"/jobs/{job_id}", skey).json
    assert job["kind"] == kind and job["gpu_count"] == 4 and job["display_name"] is None  # type: ignore[index]


def test_the_payload_is_stored_verbatim_and_never_shown(api: Api, db: Db, alice: str) -> None:
    payload = {"dataset": "d", "nested": {"list": [1, 2.5, "x", None, True], "unicode": "é ✓"},
               "learningRate": 1e-5, "big": 12345678901234567890}
    resp = api.post("/jobs", alice, json={"kind": "RFT", "fireworks_payload": payload})
    assert resp.status_code == 201
    job_id = resp.json["id"]  # type: ignore[index]
    stored = db.one("SELECT fireworks_payload FROM sftq.jobs WHERE id = %s", job_id)
    assert stored == payload
    text = api.get(f"/jobs/{job_id}", alice).get_data(as_text=True)
    assert "dataset" not in text and "learningRate" not in text


@pytest.mark.parametrize("content_type", [
    None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx",
    "application/json; charset=latin-1", "multipart/form-data; boundary=x",
])
def test_submit_needs_a_json_content_type(sapi: Api, skey: str, content_type: str | None) -> None:
    body = json.dumps({"kind": "SFT", "fireworks_payload": {}})
    assert_error(post_raw(sapi, skey, body, content_type=content_type), 415,
                 "unsupported_media_type")


@pytest.mark.parametrize("content_type", [
    "application/json", "application/json; charset=utf-8", "Application/JSON; Charset=UTF-8",
    'application/json;charset="utf-8"',
])
def test_json_content_types_with_charset_are_fine(sapi: Api, skey: str, content_type: str) -> None:
    body = json.dumps({"kind": "SFT", "fireworks_payload": {}})
    assert post_raw(sapi, skey, body, content_type=content_type).status_code == 201


def test_a_declared_oversized_body_is_413_before_it_is_read(api: Api, alice: str,
                                                              settings: Settings) -> None:
    class Unreadable(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            raise AssertionError("the body was read")

    resp = api.post("/jobs", alice, input_stream=Unreadable(),
                    environ_overrides={"CONTENT_LENGTH": str(settings.max_body_bytes + 1),
                                       "CONTENT_TYPE": "application/json"})
    assert_error(resp, 413, "payload_too_large")


def test_an_undeclared_oversized_body_is_capped(api: Api, alice: str, settings: Settings) -> None:
    big = b'{"kind": "SFT", "fireworks_payload": {"x": "' + b"a" * settings.max_body_bytes + b'"}}'
    read: list[int] = []

    class Chunked(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            read.append(-1 if n is None else n)
            return super().read(n)

    resp = api.post("/jobs", alice, input_stream=Chunked(big),
                    headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                    environ_overrides={"wsgi.input_terminated": True})
    assert_error(resp, 413, "payload_too_large")
    assert sum(read) <= settings.max_body_bytes + 1 and -1 not in read


def test_a_body_just_under_the_limit_is_fine(api: Api, alice: str, settings: Settings) -> None:
    head, tail = b'{"kind": "SFT", "fireworks_payload": {"x": "', b'"}}'
    body = head + b"a" * (settings.max_body_bytes - len(head) - len(tail)) + tail
    assert len(body) == settings.max_body_bytes
    assert post_raw(api, alice, body).status_code == 201


@pytest.mark.parametrize("body", [
    b"", b"{", b"not json", b'{"kind": "SFT",}', b"{'kind': 'SFT'}", b'{"kind": "SFT"} trailing',
    b'\xff\xfe{"kind": "SFT"}', b'{"kind": "SFT", "fireworks_payload": {"a": NaN}}',
    b'{"kind": "SFT", "fireworks_payload": {"a": Infinity}}',
    b'{"kind": "SFT", "fireworks_payload": {"a": 1e999}}',
    b'{"kind": "SFT", "fireworks_payload": {"a": "\\ud800"}}',
])
def test_malformed_json_is_400_invalid_json(sapi: Api, skey: str, body: bytes) -> None:
    assert_error(post_raw(sapi, skey, body), 400, "invalid_json")


@pytest.mark.parametrize("body", [b"[]", b"[1, 2]", b'"SFT"', b"42", b"null", b"true"])
def test_a_body_that_is_not_an_object_is_400(sapi: Api, skey: str, body: bytes) -> None:
    assert_error(post_raw(sapi, skey, body), 400, "validation_error")


@pytest.mark.parametrize("body", [
    {"kind": "SFT"},
    {"kind": "SFT", "fireworks_payload": None},
    {"kind": "SFT", "display_name": "x", "gpu_count": 4},
    # The commonest mistake: the bare Fireworks body (unknown fields, no kind) posted as is.
    dict(SFT_PAYLOAD),
    {"kind": "BOGUS", "fireworks_payload": None, "typo": 1},
])
def test_missing_payload_has_the_contract_message(sapi: Api, skey: str,
                                                  body: dict[str, Any]) -> None:
    resp = sapi.post("/jobs", skey, json=body)
    err = assert_error(resp, 400, "missing_payload")
    assert err["error"] == "fireworks_payload is required"


@pytest.mark.parametrize("payload", [[], [1], "text", 1, True, 1.5])
def test_payload_must_be_an_object(sapi: Api, skey: str, payload: Any) -> None:
    resp = sapi.post("/jobs", skey, json={"kind": "SFT", "fireworks_payload": payload})
    err = assert_error(resp, 400, "validation_error")
    assert err["details"] == [{"field": "fireworks_payload", "path": "fireworks_payload",
                               "message": "fireworks_payload must be a JSON object"}]


# "sft" is SFT since issue 18.6; a non-ASCII look-alike (U+017F upper-cases to "S") is not.
@pytest.mark.parametrize("kind", [None, "", "\u017fft", "PPO", 1, ["SFT"], {"k": "SFT"}])
def test_kind_must_be_one_of_three(sapi: Api, skey: str, kind: Any) -> None:
    resp = sapi.post("/jobs", skey, json={"kind": kind, "fireworks_payload": {}})
    err = assert_error(resp, 400, "validation_error")
    assert err["error"] == "kind must be one of SFT, DPO, RFT"


def test_kind_is_required(api: Api, alice: str) -> None:
    err = assert_error(api.post("/jobs", alice, json={"fireworks_payload": {}}), 400,
                       "validation_error")
    assert err["error"] == "kind is required"
    assert err["details"] == [{"field": "kind", "path": "kind", "message": "kind is required"}]


@pytest.mark.parametrize("gpu_count",
                         [0, -1, 65, 1000, 4.5, 4.0, "4", True, False, None, [4], 2**70])
def test_gpu_count_must_be_an_integer_from_1_to_64(sapi: Api, skey: str, gpu_count: Any) -> None:
    resp = sapi.post("/jobs", skey, json={"kind": "SFT", "fireworks_payload": {},
                                          "gpu_count": gpu_count})
    err = assert_error(resp, 400, "validation_error")
    assert err["error"] == "gpu_count must be an integer from 1 to 64"


@pytest.mark.parametrize("gpu_count", [1, 8, 64])
def test_gpu_count_bounds_are_inclusive(sapi: Api, skey: str, gpu_count: int) -> None:
    job_id = sapi.enqueue(skey, gpu_count=gpu_count)
    assert sapi.get(f"/jobs/{job_id}", skey).json["gpu_count"] == gpu_count  # type: ignore[index]


@pytest.mark.parametrize("name", ["a" * 257, 5, ["x"], {"x": 1}, True])
def test_display_name_must_be_a_short_string(sapi: Api, skey: str, name: Any) -> None:
    resp = sapi.post("/jobs", skey, json={"kind": "SFT", "fireworks_payload": {},
                                          "display_name": name})
    err = assert_error(resp, 400, "validation_error")
    assert err["error"] == "display_name must be a string of at most 256 characters"


@pytest.mark.parametrize("name", [None, "", "a" * 256, "ünïcødé ✓ " * 25])
def test_display_name_edge_values_are_fine(sapi: Api, skey: str, name: str | None) -> None:
    resp = sapi.post("/jobs", skey, json={"kind": "SFT", "fireworks_payload": {},
                                          "display_name": name})
    assert resp.status_code == 201, resp.json
    job = sapi.get(f"/jobs/{resp.json['id']}", skey).json  # type: ignore[index]
    assert job["display_name"] == name  # type: ignore[index]


def test_payload_display_name_is_the_default_name(sapi: Api, skey: str) -> None:
    """Issue 54.12: without display_name, the job takes the payload's displayName, cut to the
    limit; an explicit display_name wins."""
    for given, payload_name, expected in (
            ({}, "qwen3 sft run", "qwen3 sft run"),
            ({"display_name": None}, "x" * 300, "x" * 256),
            ({"display_name": "mine"}, "theirs", "mine"),
            ({}, "   ", None),
            ({}, 5, None)):
        resp = sapi.post("/jobs", skey, json={"kind": "SFT", **given,
                                              "fireworks_payload": {**SFT_PAYLOAD,
                                                                    "displayName": payload_name}})
        assert resp.status_code == 201, resp.json
        job = sapi.get(f"/jobs/{resp.json['id']}", skey).json  # type: ignore[index]
        assert job["display_name"] == expected, given  # type: ignore[index]


def test_unknown_fields_are_rejected_by_name(api: Api, alice: str) -> None:
    resp = api.post("/jobs", alice, json={"kind": "SFT", "fireworks_payload": {}, "gpus": 8,
                                          "displayName": "x"})
    err = assert_error(resp, 400, "unknown_field")
    assert "gpus" in err["error"] and "displayName" in err["error"]
    assert err["details"]["unknown_fields"] == ["displayName", "gpus"]
    assert err["details"]["allowed_fields"] == ["after", "display_name", "fireworks_payload",
                                                "gpu_count", "kind", "max_run_seconds",
                                                "queue_timeout_seconds", "validate"]
    assert api.get("/jobs", alice).json == []


def test_several_field_errors_are_all_reported(api: Api, alice: str) -> None:
    resp = api.post("/jobs", alice, json={"kind": "X", "fireworks_payload": [], "gpu_count": 0,
                                          "display_name": 1})
    err = assert_error(resp, 400, "validation_error")
    assert [d["field"] for d in err["details"]] == ["kind", "fireworks_payload", "display_name",
                                                    "gpu_count"]


def test_nul_characters_are_refused_not_a_500(api: Api, alice: str) -> None:
    for body in ({"kind": "SFT", "fireworks_payload": {"a": "x\u0000y"}},
                 {"kind": "SFT", "fireworks_payload": {"k\u0000": 1}},
                 {"kind": "SFT", "fireworks_payload": {"a": [{"b": "\u0000"}]}},
                 {"kind": "SFT", "fireworks_payload": {}, "display_name": "a\u0000"}):
        assert_error(api.post("/jobs", alice, json=body), 400, "validation_error")
    # An escaped backslash followed by "u0000" is ordinary text.
    resp = post_raw(api, alice, b'{"kind": "SFT", "fireworks_payload": {"a": "\\\\u0000"}}')
    assert resp.status_code == 201


def test_nothing_is_enqueued_by_a_refused_request(api: Api, alice: str) -> None:
    post_raw(api, alice, b"{")
    api.post("/jobs", alice, json={"kind": "SFT"})
    post_raw(api, alice, b'{"kind": "SFT", "fireworks_payload": {}}', content_type="text/plain")
    assert api.get("/jobs", alice).json == []


# --- idempotency --------------------------------------------------------------------------

def test_same_idempotency_key_and_body_replays_the_job(api: Api, alice: str) -> None:
    first = api.submit(alice, display_name="x", headers={"Idempotency-Key": "req-1"})
    again = api.submit(alice, display_name="x", headers={"Idempotency-Key": "req-1"})
    assert first.status_code == again.status_code == 201
    assert again.json == first.json
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Location"] == first.headers["Location"]
    assert len(api.get("/jobs", alice).json) == 1  # type: ignore[arg-type]


def test_same_idempotency_key_with_another_body_is_409(api: Api, alice: str) -> None:
    first = api.submit(alice, gpu_count=4, headers={"Idempotency-Key": "req-1"})
    resp = api.submit(alice, gpu_count=8, headers={"Idempotency-Key": "req-1"})
    err = assert_error(resp, 409, "idempotency_conflict")
    assert err["details"] == {"job_id": first.json["id"]}  # type: ignore[index]


def test_idempotency_keys_are_per_user(api: Api, alice: str, bob: str) -> None:
    a = api.submit(alice, headers={"Idempotency-Key": "same"})
    b = api.submit(bob, headers={"Idempotency-Key": "same"})
    assert a.status_code == b.status_code == 201
    assert a.json["id"] != b.json["id"]  # type: ignore[index]
    assert "Idempotent-Replayed" not in b.headers


def test_a_replay_survives_the_job_moving_on(api: Api, db: Db, alice: str) -> None:
    first = api.submit(alice, headers={"Idempotency-Key": "k"})
    job_id = first.json["id"]  # type: ignore[index]
    api.delete(f"/jobs/{job_id}", alice)
    again = api.submit(alice, headers={"Idempotency-Key": "k"})
    assert again.status_code == 201 and again.json["id"] == job_id  # type: ignore[index]
    assert again.json["state"] == "CANCELLED"  # type: ignore[index]


@pytest.mark.parametrize("key", ["", " ", "a" * 256, "tab\there", " lead", "trail "])
def test_bad_idempotency_keys_are_400(sapi: Api, skey: str, key: str) -> None:
    assert_error(sapi.submit(skey, headers={"Idempotency-Key": key}), 400, "validation_error")


def test_a_255_character_idempotency_key_is_fine(api: Api, alice: str) -> None:
    assert api.submit(alice, headers={"Idempotency-Key": "k" * 255}).status_code == 201


# --- GET /jobs ------------------------------------------------------------------------------

def test_list_is_newest_first_and_only_the_callers(api: Api, alice: str, bob: str) -> None:
    mine = [api.enqueue(alice, display_name=f"a{i}") for i in range(3)]
    api.enqueue(bob)
    resp = api.get("/jobs", alice)
    assert resp.status_code == 200
    jobs = resp.json
    assert isinstance(jobs, list)
    assert [j["id"] for j in jobs] == mine[::-1]
    assert all(set(j) == JOB_KEYS for j in jobs)
    assert "X-Next-Cursor" not in resp.headers and "Link" not in resp.headers
    assert len(api.get("/jobs", bob).json) == 1  # type: ignore[arg-type]


def test_list_filters_by_state_and_kind(api: Api, db: Db, alice: str) -> None:
    sft = api.enqueue(alice, "SFT")
    dpo = api.enqueue(alice, "DPO")
    rft = api.enqueue(alice, "RFT")
    api.delete(f"/jobs/{rft}", alice)
    db.admit()  # the earliest (sft) goes to PROGRESS

    def ids(query: str) -> list[str]:
        return [j["id"] for j in api.get("/jobs" + query, alice).json]  # type: ignore[union-attr]

    assert ids("?state=PROGRESS") == [sft]
    assert ids("?state=QUEUED") == [dpo]
    assert ids("?state=CANCELLED") == [rft]
    assert ids("?state=SUCCESS") == []
    assert ids("?kind=DPO") == [dpo]
    assert ids("?kind=SFT&state=PROGRESS") == [sft]
    assert ids("?kind=SFT&state=QUEUED") == []


def test_without_limit_every_job_and_pages_of_100_when_asked(api: Api, alice: str) -> None:
    # The contract's "all of your jobs, newest first": no paging parameter, no page.
    ids = [api.enqueue(alice) for _ in range(105)][::-1]
    everything = api.get("/jobs", alice)
    assert [j["id"] for j in everything.json] == ids  # type: ignore[union-attr]
    assert "X-Next-Cursor" not in everything.headers and "Link" not in everything.headers
    # Paging when asked for, as before (see test_http_visibility.py for the long lists).
    first = api.get("/jobs?limit=100", alice)
    assert [j["id"] for j in first.json] == ids[:100]  # type: ignore[union-attr]
    cursor = first.headers["X-Next-Cursor"]
    assert first.headers["Link"] == f'</jobs?limit=100&cursor={cursor}>; rel="next"'
    # A cursor alone pages by 100.
    second = api.get(f"/jobs?cursor={cursor}", alice)
    assert [j["id"] for j in second.json] == ids[100:]  # type: ignore[union-attr]
    assert "X-Next-Cursor" not in second.headers


def test_paging_with_limit_and_filters_walks_everything_once(api: Api, alice: str) -> None:
    sft = [api.enqueue(alice, "SFT") for _ in range(7)][::-1]
    for _ in range(3):
        api.enqueue(alice, "DPO")
    seen: list[str] = []
    url = "/jobs?kind=SFT&limit=3"
    pages = 0
    while True:
        resp = api.get(url, alice)
        assert resp.status_code == 200
        seen += [j["id"] for j in resp.json]  # type: ignore[union-attr]
        pages += 1
        link = resp.headers.get("Link")
        if not link:
            break
        url = link[link.index("<") + 1:link.index(">")]
        assert "kind=SFT" in url and "limit=3" in url
    assert seen == sft and pages == 3


def test_limit_bounds(api: Api, alice: str) -> None:
    for _ in range(3):
        api.enqueue(alice)
    one = api.get("/jobs?limit=1", alice)
    assert len(one.json) == 1 and "X-Next-Cursor" in one.headers  # type: ignore[arg-type]
    full = api.get("/jobs?limit=3", alice)
    assert len(full.json) == 3 and "X-Next-Cursor" not in full.headers  # type: ignore[arg-type]
    most = api.get("/jobs?limit=1000", alice)
    assert len(most.json) == 3 and "X-Next-Cursor" not in most.headers  # type: ignore[arg-type]


@pytest.mark.parametrize("query", [
    "?state=DONE", "?state=", "?kind=PPO", "?kind=",
    "?limit=0", "?limit=1001", "?limit=-1", "?limit=abc", "?limit=", "?limit=1.5", "?limit=99999",
    "?cursor=", "?cursor=abc", "?cursor=123_xyz", "?cursor=1_" + "0" * 31,
    "?cursor=" + "9" * 18 + "_" + "0" * 32, "?status=QUEUED", "?state=QUEUED&state=FAIL",
])
def test_bad_list_parameters_are_400(sapi: Api, skey: str, query: str) -> None:
    assert_error(sapi.get("/jobs" + query, skey), 400, "validation_error")


def test_a_well_formed_unknown_cursor_is_just_an_empty_page(api: Api, alice: str) -> None:
    api.enqueue(alice)
    resp = api.get("/jobs?cursor=1_" + "0" * 32, alice)
    assert resp.status_code == 200 and resp.json == []


# --- GET /jobs/{id} -------------------------------------------------------------------------

def test_get_one_job(api: Api, alice: str) -> None:
    job_id = api.enqueue(alice, "DPO", display_name="dpo run", gpu_count=2)
    resp = api.get(f"/jobs/{job_id}", alice)
    assert resp.status_code == 200
    job = resp.json
    assert job == {**job, "id": job_id, "kind": "DPO", "state": "QUEUED",  # type: ignore[dict-item]
                   "display_name": "dpo run", "gpu_count": 2, "started_at": None,
                   "completed_at": None, "error": None, "fireworks_job_name": None}
    # Upper-case hex names the same job.
    assert api.get(f"/jobs/{job_id.upper()}", alice).json == job


@pytest.mark.parametrize("bad", [
    "nope", "123", "00000000-0000-0000-0000-00000000000", "00000000-0000-0000-0000-0000000000000",
    "00000000000000000000000000000000", "{00000000-0000-0000-0000-000000000000}",
    "urn:uuid:00000000-0000-0000-0000-000000000000", "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz",
    "%27%20OR%201=1--", "..", "analytics",
])
def test_malformed_ids_are_404_never_500(sapi: Api, skey: str, bad: str) -> None:
    for method, path in [("GET", f"/jobs/{bad}"), ("DELETE", f"/jobs/{bad}"),
                         ("GET", f"/jobs/{bad}/analytics")]:
        assert_error(sapi.request(method, path, key=skey), 404, "not_found")


def test_other_users_jobs_are_404_not_403(api: Api, alice: str, bob: str, db: Db) -> None:
    job_id = api.enqueue(alice)
    unknown = str(uuid.uuid4())
    for target in (job_id, unknown):
        for method, path in [("GET", f"/jobs/{target}"), ("DELETE", f"/jobs/{target}"),
                             ("GET", f"/jobs/{target}/analytics")]:
            resp = api.request(method, path, key=bob)
            err = assert_error(resp, 404, "not_found")
            assert err == {"error": "job not found", "code": "not_found"}
    # Bob's attempt changed nothing.
    assert db.state(job_id) == "QUEUED"
    assert api.get("/jobs", bob).json == []


# --- routing --------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/", "/job", "/jobs/x/y", "/jobs/analytics", "/jobs/analytics/x",
                                  "/health/x", "/functions/v1/analytics/jobs", "//jobs", ""])
def test_unknown_routes_are_404(sapi: Api, skey: str, path: str) -> None:
    assert_error(sapi.get(path, skey), 404, "not_found")


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("PUT", "/jobs", "GET, POST"),
    ("DELETE", "/jobs", "GET, POST"),
    ("PATCH", "/jobs/00000000-0000-0000-0000-000000000000", "DELETE, GET"),
    ("POST", "/jobs/00000000-0000-0000-0000-000000000000", "DELETE, GET"),
    ("DELETE", "/jobs/analytics/queue", "GET"),
    ("POST", "/jobs/analytics/summary", "GET"),
    ("DELETE", "/jobs/00000000-0000-0000-0000-000000000000/analytics", "GET"),
    ("POST", "/health", "GET"),
    ("DELETE", "/openapi.json", "GET"),
])
def test_wrong_method_is_405_with_allow(sapi: Api, skey: str, method: str, path: str,
                                        allow: str) -> None:
    resp = sapi.request(method, path, key=skey)
    assert_error(resp, 405, "method_not_allowed")
    assert resp.headers["Allow"] == allow


def test_analytics_paths_are_not_job_ids(api: Api, alice: str) -> None:
    assert set(api.get("/jobs/analytics/queue", alice).json) >= {"your_queued_jobs"}  # type: ignore[arg-type]
    assert set(api.get("/jobs/analytics/summary", alice).json) >= {"by_state"}  # type: ignore[arg-type]


def test_a_trailing_slash_is_the_same_route(api: Api, alice: str) -> None:
    job_id = api.enqueue(alice)
    assert api.get("/jobs/", alice).status_code == 200
    assert api.get(f"/jobs/{job_id}/", alice).json["id"] == job_id  # type: ignore[index]


def test_the_full_public_path_works_too(api: Api, alice: str) -> None:
    """A host that forwards /functions/v1/jobs-api/... unstripped reaches the same routes."""
    resp = api.submit(alice)
    job_id = resp.json["id"]  # type: ignore[index]
    full = api.get(f"/functions/v1/jobs-api/jobs/{job_id}", alice)
    assert full.status_code == 200 and full.json["id"] == job_id  # type: ignore[index]
    again = api.post("/functions/v1/jobs-api/jobs", alice,
                     json={"kind": "SFT", "fireworks_payload": {}})
    assert again.headers["Location"].startswith("/functions/v1/jobs-api/jobs/")
