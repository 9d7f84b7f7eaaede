"""POST /jobs/{id}/retry and queue_timeout_seconds on POST /jobs, through the WSGI app
(issue 10); both answers are held to docs/openapi.json."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fn_support import SFT_PAYLOAD, Api, Db, FakeProvider, assert_error
from test_http_openapi import Conformance
from werkzeug.test import Client

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.http.apps import make_jobs_api
from sftq_server.http.web import wsgi_app

R = "/jobs/{id}/retry"


def _fail(db: Db, job_id: str, message: str = "CUDA out of memory") -> None:
    db.admit()
    db.submitted(job_id)
    db.provider_state(job_id, "JOB_STATE_FAILED", message, after=30)


def _events(db: Db, job_id: str) -> list[tuple[str, Any]]:
    return [(r[0], r[1]) for r in db.conn.execute(
        "SELECT event, detail FROM sftq.job_events WHERE job_id = %s ORDER BY id", (job_id,))]


def test_retry_a_failed_job(api: Api, db: Db, alice: str) -> None:
    conformance = Conformance()
    old = api.enqueue(alice, "DPO", display_name="dpo run", gpu_count=8)
    _fail(db, old)
    later = api.enqueue(alice)  # queued before the retry: the retry goes behind it
    resp = api.post(f"/jobs/{old}/retry", alice)
    conformance.check(resp, "POST", R)
    assert resp.status_code == 201
    body = resp.json
    assert isinstance(body, dict)
    assert set(body) == {"id", "kind", "state", "created_at", "retry_of"}
    assert (body["kind"], body["state"], body["retry_of"]) == ("DPO", "QUEUED", old)
    assert resp.headers["Location"].endswith(f"/jobs/{body['id']}")
    new = api.get(f"/jobs/{body['id']}", alice).json
    assert isinstance(new, dict)
    assert (new["display_name"], new["gpu_count"], new["retry_of"]) == ("dpo run", 8, old)
    assert db.one("SELECT fireworks_payload FROM sftq.jobs WHERE id = %s", body["id"]) == \
        SFT_PAYLOAD
    # At the back of the queue: behind the job queued before the retry.
    ids = [j["id"] for j in api.get("/jobs?state=QUEUED", alice).json]  # type: ignore[union-attr]
    assert ids == [body["id"], later]
    # The old job keeps its state and says what became of it; the new one where it came from.
    old_job = api.get(f"/jobs/{old}", alice).json
    assert isinstance(old_job, dict)
    assert (old_job["state"], old_job["failure_class"], old_job["retry_of"]) == \
        ("FAIL", "permanent", None)
    assert _events(db, old)[-1] == ("retried", {"new_job_id": body["id"]})
    assert _events(db, body["id"]) == [("queued", {"retry_of": old})]


def test_retry_a_cancelled_job_and_idempotency(api: Api, alice: str) -> None:
    old = api.enqueue(alice)
    assert api.delete(f"/jobs/{old}", alice).status_code == 200
    first = api.post(f"/jobs/{old}/retry", alice, headers={"Idempotency-Key": "r-1"})
    again = api.post(f"/jobs/{old}/retry", alice, headers={"Idempotency-Key": "r-1"})
    assert first.status_code == again.status_code == 201
    assert first.json == again.json and again.headers["Idempotent-Replayed"] == "true"
    # Without a key each call makes a new job; a key used for another request is a conflict.
    other = api.post(f"/jobs/{old}/retry", alice)
    assert other.status_code == 201 and other.json["id"] != first.json["id"]  # type: ignore[index]
    reused = api.submit(alice, headers={"Idempotency-Key": "r-1"})
    assert_error(reused, 409, "idempotency_conflict")


@pytest.mark.parametrize("state", ["QUEUED", "PROGRESS", "SUCCESS"])
def test_retry_of_a_job_that_did_not_end_badly_is_409(api: Api, db: Db, alice: str,
                                                      state: str) -> None:
    job_id = api.enqueue(alice)
    if state != "QUEUED":
        db.admit()
        db.submitted(job_id)
    if state == "SUCCESS":
        db.provider_state(job_id, "COMPLETED", after=5)
    resp = api.post(f"/jobs/{job_id}/retry", alice)
    body = assert_error(resp, 409, "job_not_retryable")
    assert body["details"] == {"state": state}
    assert "only a FAIL or CANCELLED job can be retried" in body["error"]
    Conformance().check(resp, "POST", R)


def test_retry_of_someone_elses_or_no_job_is_404(api: Api, db: Db, alice: str, bob: str) -> None:
    old = api.enqueue(alice)
    api.delete(f"/jobs/{old}", alice)
    conformance = Conformance()
    for key, target in ((bob, old), (alice, "00000000-0000-4000-8000-000000000000"),
                        (alice, "nope")):
        resp = api.post(f"/jobs/{target}/retry", key)
        assert_error(resp, 404, "not_found")
        conformance.check(resp, "POST", R)
    resp = api.post(f"/jobs/{old}/retry")
    assert_error(resp, 401, "unauthorized")
    conformance.check(resp, "POST", R)
    assert db.one("SELECT count(*) FROM sftq.jobs") == 1


def test_queue_timeout_is_stored_and_validated(api: Api, db: Db, alice: str) -> None:
    job_id = api.enqueue(alice, queue_timeout_seconds=3600)
    row = db.conn.execute("SELECT queue_timeout_seconds, queue_expires_at - created_at "
                          "FROM sftq.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None and row[0] == 3600 and row[1].total_seconds() == 3600
    assert db.one("SELECT queue_timeout_seconds FROM sftq.jobs WHERE id = %s",
                  api.enqueue(alice)) is None
    for bad in (0, 2592001, -1, "60", 1.5, True):
        resp = api.submit(alice, queue_timeout_seconds=bad)
        body = assert_error(resp, 400, "validation_error")
        assert body["details"] == [{"field": "queue_timeout_seconds",
                                    "path": "queue_timeout_seconds",
                                    "message": "queue_timeout_seconds must be an integer from 1 "
                                               "to 2592000 (30 days)"}], bad
    assert api.submit(alice, queue_timeout_seconds=2592000).status_code == 201
    assert api.submit(alice, queue_timeout_seconds=None).status_code == 201


@pytest.fixture
def defaulted(settings: Settings, database: Database) -> Iterator[Api]:
    app = make_jobs_api(Settings(**{**settings.__dict__, "queue_timeout_seconds": 600}),
                        db=database, provider_factory=FakeProvider)
    try:
        yield Api(Client(wsgi_app(app)))
    finally:
        app.api.close()


def test_the_operator_default_applies_when_a_submit_has_none(defaulted: Api, db: Db,
                                                             alice: str) -> None:
    plain = defaulted.enqueue(alice)
    own = defaulted.enqueue(alice, queue_timeout_seconds=60)
    timeouts = dict(db.conn.execute("SELECT id::text, queue_timeout_seconds FROM sftq.jobs"))
    assert timeouts == {plain: 600, own: 60}
    # The default is the operator's, not part of the request: the same key and body replay.
    for _ in range(2):
        resp = defaulted.submit(alice, headers={"Idempotency-Key": "k"})
        assert resp.status_code == 201
    assert db.one("SELECT count(*) FROM sftq.jobs WHERE idempotency_key = 'k'") == 1
    # A retry of a job without a timeout of its own gets the default too.
    defaulted.delete(f"/jobs/{plain}", alice)
    retried = defaulted.post(f"/jobs/{plain}/retry", alice).json
    assert isinstance(retried, dict)
    assert db.one("SELECT queue_timeout_seconds FROM sftq.jobs WHERE id = %s", retried["id"]) == 600


def test_a_timed_out_job_is_cancelled_with_a_reason(api: Api, db: Db, alice: str) -> None:
    job_id = api.enqueue(alice, queue_timeout_seconds=60)
    other = api.enqueue(alice)
    assert db.one("SELECT sftq.expire_queued()") == 0
    assert db.one("SELECT sftq.expire_queued(now() + interval '61 seconds')") == 1
    job = api.get(f"/jobs/{job_id}", alice).json
    assert isinstance(job, dict)
    assert job["state"] == "CANCELLED"
    assert job["error"].startswith("timed out in the queue: still QUEUED after 6")
    event, detail = _events(db, job_id)[-1]
    assert event == "queue_timeout"
    assert detail == {"reason": "queue_timeout", "queue_timeout_seconds": 60}
    assert db.state(other) == "QUEUED"
    # The user's next job heads their queue now, and the timed-out one can be retried.
    assert db.one("SELECT head_job_id::text FROM sftq.users WHERE name = 'alice'") == other
    assert api.post(f"/jobs/{job_id}/retry", alice).status_code == 201


def test_submit_body_with_queue_timeout_is_documented(api: Api, alice: str) -> None:
    from test_http_openapi import schema_validator

    body = {"kind": "SFT", "fireworks_payload": {}, "queue_timeout_seconds": 60}
    assert schema_validator({"$ref": "#/components/schemas/SubmitRequest"}).is_valid(body)
    assert not schema_validator({"$ref": "#/components/schemas/SubmitRequest"}).is_valid(
        {**body, "queue_timeout_seconds": 0})
    resp = api.post("/jobs", alice, data=json.dumps(body), content_type="application/json")
    Conformance().check(resp, "POST", "/jobs")
