"""GET /jobs/{id}/events: a job's history, oldest first, paged, with a sentence per event and
the details redacted; checked along every path a job can take."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from fn_support import Api, Db, FakeProvider, assert_error
from test_http_openapi import Conformance

from sftq_server.http.models import EventPage
from sftq_server.provider import Transient

EVENT_KEYS = {"id", "job_id", "type", "state", "message", "created_at", "data"}


def events(api: Api, key: str, job_id: str, query: str = "") -> list[dict[str, Any]]:
    """Every event of the job, following the pages."""
    out: list[dict[str, Any]] = []
    after = ""
    while True:
        resp = api.get(f"/jobs/{job_id}/events?limit=100{after}{query}", key)
        assert resp.status_code == 200, resp.get_data(as_text=True)
        body = resp.json
        assert isinstance(body, dict) and set(body) == {"data", "has_more"}
        EventPage.model_validate(body)
        out += body["data"]
        if not body["has_more"]:
            return out
        after = f"&after={body['data'][-1]['id']}"


def kinds(evs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["state"]) for e in evs]


def event(db: Db, job_id: str, type_: str, state: str, detail: dict[str, Any] | None = None,
          actor: str = "scheduler") -> None:
    """An event as other parts of the system write it (through sftq._event)."""
    db.conn.execute("SELECT sftq._event(%s, now(), %s, %s, %s, %s::jsonb)",
                    (job_id, actor, type_, state, None if detail is None else json.dumps(detail)))


# --- the route ---------------------------------------------------------------------------------

def test_shape_order_and_paging(api: Api, db: Db, alice: str) -> None:
    job = api.enqueue(alice, display_name="history")
    for pct in range(1, 60):
        event(db, job, "provider_state", "QUEUED", {"progress_percent": pct})
    first = api.get(f"/jobs/{job}/events", alice)
    assert first.status_code == 200 and first.content_type == "application/json"
    body = first.json
    assert isinstance(body, dict) and body["has_more"] is True
    assert len(body["data"]) == 50  # the default page
    ev = body["data"][0]
    assert set(ev) == EVENT_KEYS
    assert (ev["type"], ev["state"], ev["job_id"]) == ("queued", "QUEUED", job)
    assert ev["message"] == "Queued: waiting for admission."
    assert ev["created_at"].endswith("Z") and ev["data"] == {}
    ids = [int(e["id"]) for e in body["data"]]
    assert ids == sorted(ids) and all(isinstance(e["id"], str) for e in body["data"])
    rest = api.get(f"/jobs/{job}/events?after={ids[-1]}", alice).json
    assert rest["has_more"] is False and len(rest["data"]) == 10  # type: ignore[index]
    assert len(events(api, alice, job)) == 60
    small = api.get(f"/jobs/{job}/events?limit=1", alice).json
    assert len(small["data"]) == 1 and small["has_more"] is True  # type: ignore[index]
    assert api.get(f"/jobs/{job}/events?after=999999999999", alice).json == {
        "data": [], "has_more": False}


@pytest.mark.parametrize("query", [
    "?limit=0", "?limit=101", "?limit=-1", "?limit=abc", "?limit=", "?limit=1.5", "?after=x",
    "?after=-1", "?after=", "?after=1e3", "?after=" + "9" * 19, "?cursor=1", "?limit=1&limit=2",
])
def test_bad_parameters_are_400(sapi: Api, skey: str, query: str) -> None:
    job = sapi.enqueue(skey)
    assert_error(sapi.get(f"/jobs/{job}/events{query}", skey), 400, "validation_error")


def test_another_users_job_is_404_and_no_key_is_401(api: Api, alice: str, bob: str) -> None:
    job = api.enqueue(alice)
    assert_error(api.get(f"/jobs/{job}/events", bob), 404, "not_found")
    assert_error(api.get(f"/jobs/{uuid.uuid4()}/events", alice), 404, "not_found")
    assert_error(api.get("/jobs/not-a-uuid/events", alice), 404, "not_found")
    assert_error(api.get(f"/jobs/{job}/events"), 401, "unauthorized")


def test_details_are_redacted(api: Api, db: Db, alice: str) -> None:
    job = api.enqueue(alice)
    event(db, job, "provider_state", "QUEUED",
          {"provider_state": "JOB_STATE_RUNNING",
           "echo": {"wandbConfig": {"apiKey": "wandb-SECRET-0123456789"}}})
    text = api.get(f"/jobs/{job}/events", alice).get_data(as_text=True)
    assert "SECRET" not in text and "[REDACTED]" in text


def test_every_answer_conforms_to_the_document(api: Api, alice: str, bob: str) -> None:
    conformance = Conformance()
    template = "/jobs/{id}/events"
    job = api.enqueue(alice)
    path = f"/jobs/{job}/events"
    for resp in (api.get(path, alice), api.get(path + "?limit=0", alice), api.get(path, bob),
                 api.get(path)):
        conformance.check(resp, "GET", template)
    assert {s for _, _, s in conformance.seen} == {200, 400, 401, 404}


# --- the paths a job takes ---------------------------------------------------------------------

def test_success(api: Api, db: Db, alice: str) -> None:
    job = api.enqueue(alice, gpu_count=2)
    db.admit(10)
    name = db.submitted(job)
    db.provider_state(job, "JOB_STATE_COMPLETED", after=60)
    evs = events(api, alice, job)
    assert kinds(evs) == [("queued", "QUEUED"), ("admitted", "PROGRESS"),
                          ("submitted", "PROGRESS"), ("succeeded", "SUCCESS")]
    assert [e["message"] for e in evs] == [
        "Queued: waiting for admission.",
        "Admitted: it needed 2 GPUs and 10 were free.",
        f"Submitted to the provider as {name}.",
        "Finished successfully.",
    ]
    assert evs[1]["data"]["gpu_budget"] == 10


def test_provider_progress_then_failure(api: Api, db: Db, alice: str) -> None:
    job = api.enqueue(alice)
    db.admit()
    db.submitted(job)
    # provider_state events as the tick writes them when the state or progress changes.
    event(db, job, "provider_state", "PROGRESS",
          {"provider_state": "JOB_STATE_RUNNING", "progress_percent": 42, "progress_epoch": 2,
           "estimated_cost": {"amount": "3.10"}})
    db.provider_state(job, "JOB_STATE_FAILED", "CUDA out of memory", after=30)
    evs = events(api, alice, job)
    assert kinds(evs)[-2:] == [("provider_state", "PROGRESS"), ("failed", "FAIL")]
    assert evs[-2]["message"] == "The provider reports RUNNING, 42% done, epoch 2."
    assert evs[-1]["message"].startswith("Failed at the provider: CUDA out of memory")
    # With the failure class the tick adds, the sentence says whether a retry can help.
    event(db, job, "failed", "FAIL", {"message": "bad dataset", "failure_class": "permanent"})
    assert events(api, alice, job)[-1]["message"] == (
        "Failed at the provider: bad dataset The failure is permanent: a retry would fail the "
        "same way.")


def test_submission_rejected(api: Api, db: Db, alice: str) -> None:
    job = api.enqueue(alice)
    db.admit()
    db.conn.execute("SELECT sftq.record_submit_error(%s, 'temporarily unavailable', true)", (job,))
    db.conn.execute("SELECT sftq.record_submit_error(%s, %s, false)",
                    (job, '{"error": "invalid baseModel"}'))
    evs = events(api, alice, job)
    assert kinds(evs)[:3] == [("queued", "QUEUED"), ("admitted", "PROGRESS"),
                              ("submit_retry", "PROGRESS")]
    assert evs[2]["message"] == ("Submission attempt 1 failed with a temporary error; the "
                                 "scheduler tries again at its next tick.")
    # Today's type, or the tick's fold into failed with detail.reason: the same sentence.
    last = evs[-1]
    assert (last["type"], last["state"]) in (("submission_rejected", "FAIL"), ("failed", "FAIL"))
    assert "the provider rejected the submission" in last["message"]
    assert "job's error field holds its answer" in last["message"]
    event(db, job, "failed", "FAIL", {"reason": "submission_rejected",
                                      "failure_class": "permanent"})
    assert events(api, alice, job)[-1]["message"].startswith(
        "Failed: the provider rejected the submission; the job's error field holds its answer.")


def test_cancel_while_queued(api: Api, alice: str) -> None:
    job = api.enqueue(alice)
    assert api.delete(f"/jobs/{job}", alice).status_code == 200
    evs = events(api, alice, job)
    assert kinds(evs) == [("queued", "QUEUED"), ("cancelled", "CANCELLED")]
    assert evs[-1]["message"] == "Cancelled while queued, at your request."


def test_cancel_while_running(api: Api, db: Db, alice: str, provider: FakeProvider) -> None:
    job = api.enqueue(alice)
    db.admit()
    db.submitted(job)
    assert api.delete(f"/jobs/{job}", alice).status_code == 200
    evs = events(api, alice, job)
    assert kinds(evs)[-2:] == [("cancel_requested", "PROGRESS"), ("cancelled", "CANCELLED")]
    assert evs[-2]["message"] == "You asked to cancel it; the provider job is being stopped."
    assert evs[-1]["message"] == "Cancelled at your request: the provider job was stopped."
    # A provider that fails the stop: the request is recorded, the tick finishes it.
    other = api.enqueue(alice)
    db.admit()
    db.submitted(other)
    provider.fail = Transient("down")
    assert api.delete(f"/jobs/{other}", alice).status_code == 202
    db.provider_state(other, "JOB_STATE_CANCELLED", after=30)
    evs = events(api, alice, other)
    assert kinds(evs)[-2:] == [("cancel_requested", "PROGRESS"), ("cancelled", "CANCELLED")]
    assert evs[-1]["message"] == "Cancelled: the provider confirmed that its job stopped."


def test_cancel_before_submission_and_outside_the_queue(api: Api, db: Db, alice: str,
                                                        bob: str) -> None:
    job = api.enqueue(alice)
    db.admit()
    assert api.delete(f"/jobs/{job}", alice).status_code == 202
    assert events(api, alice, job)[-1]["message"] == (
        "You asked to cancel it before the provider job was created; the scheduler finishes "
        "the cancel at its next tick.")
    gone = api.enqueue(bob)
    db.admit()
    db.submitted(gone)
    db.provider_state(gone, "NOT_FOUND", after=30)
    last = events(api, bob, gone)[-1]
    # Today's 'reconciled', or the tick's fold into 'cancelled' with detail.reason.
    assert (last["type"], last["state"]) in (("reconciled", "CANCELLED"),
                                             ("cancelled", "CANCELLED"))
    assert last["message"].startswith(
        "Cancelled: the provider job was deleted or cancelled outside the queue")


def test_queue_timeout(api: Api, db: Db, alice: str) -> None:
    job = api.enqueue(alice, queue_timeout_seconds=3600)
    # What the tick runs each time: QUEUED jobs past their deadline are cancelled.
    assert db.conn.execute("SELECT sftq.expire_queued(now() + interval '2 hours')"
                           ).fetchone() == (1,)
    evs = events(api, alice, job)
    assert kinds(evs) == [("queued", "QUEUED"), ("queue_timeout", "CANCELLED")]
    assert evs[-1]["message"] == (
        "Cancelled: it waited longer than its queue timeout (60 minutes) without being "
        "admitted.")


def test_retry(api: Api, db: Db, alice: str) -> None:
    old = api.enqueue(alice)
    db.admit()
    db.submitted(old)
    db.provider_state(old, "JOB_STATE_FAILED", "node lost", after=30)
    resp = api.post(f"/jobs/{old}/retry", alice)
    assert resp.status_code == 201, resp.get_data(as_text=True)
    new = str(resp.json["id"])  # type: ignore[index]
    old_last = events(api, alice, old)[-1]
    assert (old_last["type"], old_last["state"]) == ("retried", "FAIL")
    assert old_last["message"] == f"Retried as job {new}."
    assert old_last["data"]["new_job_id"] == new
    first = events(api, alice, new)[0]
    assert (first["type"], first["state"]) == ("queued", "QUEUED")
    assert first["message"] == f"Queued as a retry of job {old}."


def test_an_unknown_type_still_reads_as_a_sentence(api: Api, db: Db, alice: str) -> None:
    job = api.enqueue(alice)
    event(db, job, "webhook_sent", "QUEUED", {"endpoint": 3})
    last = events(api, alice, job)[-1]
    assert (last["type"], last["message"]) == ("webhook_sent", "Webhook Sent (the job is QUEUED).")


def test_a_submission_given_up(api: Api, db: Db, alice: str) -> None:
    job = api.enqueue(alice)
    db.admit()
    for _ in range(2):
        db.conn.execute("SELECT sftq.record_submit_error(%s, 'HTTP 503: unavailable', true)",
                        (job,))
    db.conn.execute("SELECT sftq.give_up_submission(%s)", (job,))
    evs = events(api, alice, job)
    assert kinds(evs)[-1] == ("failed", "FAIL")
    assert evs[-1]["message"].startswith(
        "Failed: the provider could not be reached to create it (2 failed attempts over ")
    assert evs[-1]["message"].endswith(
        " The failure is temporary: a retry may succeed.")
