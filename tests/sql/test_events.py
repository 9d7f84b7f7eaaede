"""A job's history as its owner reads it (sftq.event_message, sftq.event_json,
sftq.job_events_page): one sentence per type, known or not, details redacted, owner-scoped."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from .conftest import Q, check_code, t

CASES: list[tuple[str, str, str | None, str, dict[str, Any] | None, str]] = [
    ("queued", "QUEUED", None, "user:a", None, "Queued: waiting for admission."),
    ("queued", "QUEUED", None, "user:a", {"retry_of": "J0"}, "Queued as a retry of job J0."),
    ("admitted", "PROGRESS", "QUEUED", "scheduler", {"gpu_count": 1, "gpu_budget": 7},
     "Admitted: it needed 1 GPU and 7 were free."),
    ("admitted", "PROGRESS", "QUEUED", "scheduler", {}, "Admitted by the scheduler."),
    ("submitted", "PROGRESS", "PROGRESS", "scheduler", {"fireworks_job_name": "accounts/a/x/y"},
     "Submitted to the provider as accounts/a/x/y."),
    ("submitted", "PROGRESS", "PROGRESS", "scheduler",
     {"fireworks_job_name": "accounts/a/x/y", "adopted_existing": True},
     "Submitted: the provider already had it as accounts/a/x/y, and the queue adopted that job."),
    ("submit_retry", "PROGRESS", None, "scheduler", {"attempt": 3, "error": "503"},
     "Submission attempt 3 failed with a temporary error; the scheduler tries again at its next "
     "tick."),
    ("provider_state", "PROGRESS", None, "scheduler",
     {"from": "JOB_STATE_CREATING", "to": "JOB_STATE_RUNNING"},
     "The provider reports RUNNING."),
    ("provider_state", "PROGRESS", None, "scheduler",
     {"provider_state": "WRITING_RESULTS", "progress_percent": 99.5, "progress_epoch": 3},
     "The provider reports WRITING_RESULTS, 99.5% done, epoch 3."),
    ("provider_state", "PROGRESS", None, "scheduler", {"progress_percent": 7},
     "The provider reports progress, 7% done."),
    ("provider_state", "PROGRESS", None, "scheduler", {}, "The provider reported a change."),
    ("cancel_requested", "PROGRESS", "PROGRESS", "user:a", {"submitted": True},
     "You asked to cancel it; the provider job is being stopped."),
    ("cancel_requested", "PROGRESS", "PROGRESS", "admin", {"submitted": False},
     "An administrator asked to cancel it before the provider job was created; the scheduler "
     "finishes the cancel at its next tick."),
    ("cancelled", "CANCELLED", "QUEUED", "user:a", None, "Cancelled while queued, at your request."),
    ("cancelled", "CANCELLED", "QUEUED", "admin", None,
     "Cancelled while queued, by an administrator."),
    ("cancelled", "CANCELLED", "PROGRESS", "user:a", {"via": "api"},
     "Cancelled at your request: the provider job was stopped."),
    ("cancelled", "CANCELLED", "PROGRESS", "scheduler", {"provider_state": "JOB_STATE_CANCELLED"},
     "Cancelled: the provider confirmed that its job stopped."),
    ("cancelled", "CANCELLED", "PROGRESS", "scheduler",
     {"reason": "reconciled", "provider_state": "NOT_FOUND"},
     "Cancelled: the provider job was deleted or cancelled outside the queue (the provider "
     "reported NOT_FOUND)."),
    ("cancelled", "CANCELLED", "QUEUED", "scheduler", {"reason": "queue_timeout"},
     "Cancelled: it waited longer than its queue timeout without being admitted."),
    ("cancelled", "CANCELLED", "PROGRESS", "scheduler", {"reason": "something_new"},
     "Cancelled (something new)."),
    ("reconciled", "CANCELLED", "PROGRESS", "scheduler", {"provider_state": "JOB_STATE_DELETED"},
     "Cancelled: the provider job was deleted or cancelled outside the queue (the provider "
     "reported DELETED)."),
    ("succeeded", "SUCCESS", "PROGRESS", "scheduler", {}, "Finished successfully."),
    ("failed", "FAIL", "PROGRESS", "scheduler", {"message": "OOM", "failure_class": "retryable"},
     "Failed at the provider: OOM The failure is temporary: a retry may succeed."),
    ("failed", "FAIL", "PROGRESS", "scheduler",
     {"reason": "submission_rejected", "failure_class": "permanent"},
     "Failed: the provider rejected the submission; the job's error field holds its answer. The "
     "failure is permanent: a retry would fail the same way."),
    ("failed", "FAIL", "PROGRESS", "scheduler", {"provider_state": "JOB_STATE_EXPIRED"},
     "Failed: the provider reported EXPIRED."),
    ("failed", "FAIL", "PROGRESS", "scheduler", {"failure_class": "unknown"}, "Failed."),
    ("submission_rejected", "FAIL", "PROGRESS", "scheduler", {"attempt": 1},
     "Failed: the provider rejected the submission (attempt 1); the job's error field holds its "
     "answer."),
    ("queue_timeout", "CANCELLED", "QUEUED", "scheduler", {"queue_timeout_seconds": 86400},
     "Cancelled: it waited longer than its queue timeout (24.0 hours) without being admitted."),
    ("queue_timeout", "CANCELLED", "QUEUED", "scheduler", None,
     "Cancelled: it waited longer than its queue timeout without being admitted."),
    ("retried", "FAIL", None, "user:a", {"new_job_id": "J2"}, "Retried as job J2."),
    ("retried", "FAIL", None, "user:a", None, "Retried as a new job."),
    ("webhook_delivered", "SUCCESS", None, "scheduler", {"attempts": 2},
     "Webhook Delivered (the job is SUCCESS)."),
]


@pytest.mark.parametrize(("event", "state", "frm", "actor", "detail", "message"), CASES)
def test_every_type_reads_as_a_sentence(q: Q, event: str, state: str, frm: str | None,
                                        actor: str, detail: dict[str, Any] | None,
                                        message: str) -> None:
    got = q.one("SELECT sftq.event_message(%s, %s, %s, %s, %s::jsonb)", event, state, frm, actor,
                None if detail is None else json.dumps(detail))
    assert got == message


def test_event_json_redacts_and_pages(q: Q) -> None:
    a, b = q.user("a"), q.user("b")
    job = q.enqueue(a, at=t(0))
    for i in range(5):
        q.one("SELECT sftq._event(%s, %s, 'scheduler', 'provider_state', 'QUEUED', %s::jsonb)",
              job, t(i + 1), json.dumps({"progress_percent": i, "wandbConfig": {"apiKey": "S3"}}))
    page = q.one("SELECT sftq.job_events_page(%s, %s, 2)", a, job)
    assert page["has_more"] is True and [e["type"] for e in page["data"]] == [
        "queued", "provider_state"]
    assert page["data"][1]["data"] == {"progress_percent": 0,
                                       "wandbConfig": {"apiKey": "[REDACTED]"}}
    rest = q.one("SELECT sftq.job_events_page(%s, %s, 100, %s)", a, job,
                 int(page["data"][-1]["id"]))
    assert rest["has_more"] is False and len(rest["data"]) == 4
    assert "S3" not in json.dumps(rest)
    with pytest.raises(psycopg.Error) as e:
        q.one("SELECT sftq.job_events_page(%s, %s)", b, job)
    check_code(e, "SQ404")
    for bad in (0, 101):
        with pytest.raises(psycopg.Error) as e:
            q.one("SELECT sftq.job_events_page(%s, %s, %s)", a, job, bad)
        check_code(e, "SQ400")


def test_analysts_may_word_the_log_like_the_api(q: Q) -> None:
    a = q.user("a")
    job = q.enqueue(a)
    q.admit(8)
    q.conn.execute("SET ROLE sftq_analyst")
    try:
        rows = q.all("SELECT event, sftq.event_message(event, state, from_state, actor, detail) "
                     "FROM sftq.analyst_job_events WHERE job_id = %s ORDER BY id", job)
    finally:
        q.conn.execute("RESET ROLE")
    assert rows == [("queued", "Queued: waiting for admission."),
                    ("admitted", "Admitted: it needed 4 GPUs and 8 were free.")]


def test_job_json_writes_timestamps_as_iso_does(q: Q) -> None:
    """job_json spells sftq._iso's format out (for speed): the two must never differ."""
    a = q.user("a")
    job = q.enqueue(a, at=t(0.123456))
    q.admit(8, at=t(5))
    q.provider_state(job, "JOB_STATE_COMPLETED", at=t(77.5))
    got = q.one("SELECT sftq.job_json(j) FROM sftq.jobs j WHERE j.id = %s", job)
    want = q.all("SELECT sftq._iso(created_at), sftq._iso(started_at), sftq._iso(completed_at) "
                 "FROM sftq.jobs WHERE id = %s", job)[0]
    assert (got["created_at"], got["started_at"], got["completed_at"]) == want
    assert got["created_at"] == "2026-05-01T10:00:00.123456Z"
    queued = q.enqueue(a)
    assert q.one("SELECT sftq.job_json(j) FROM sftq.jobs j WHERE j.id = %s", queued)[
        "started_at"] is None


def test_event_lookups_stay_index_scans_when_planned_on_a_tiny_table(q: Q) -> None:
    """An event row's foreign-key check and the webhook outbox trigger look its job up by id
    with plans the session keeps. A session that makes them while sftq.jobs is nearly empty
    (a new deployment) must still get index lookups: a sequential scan kept there would read
    the whole table for every later event until an ANALYZE replans it."""
    u = q.user("a", cap=1)
    # The table as autovacuum leaves a new one (analyzed while nearly empty), then more than
    # the plan cache's five custom plans on it: the session keeps generic plans made at
    # that size.
    q.conn.execute("ANALYZE sftq.jobs")
    for _ in range(8):
        q.enqueue(u)
    # The table grows behind the session's back (no ANALYZE, which would replan).
    q.conn.execute(
        "INSERT INTO sftq.jobs (user_id, kind, gpu_count, fireworks_payload, created_at, state,"
        " started_at, completed_at) SELECT %s, 'SFT', 4, '{}', now() - interval '1 day',"
        " 'SUCCESS', now() - interval '1 hour', now()"
        " FROM generate_series(1, 3000)", (u,))
    with q.conn.transaction():
        q.enqueue(u)
        seq = q.one("SELECT seq_scan FROM pg_stat_xact_user_tables"
                    " WHERE relid = 'sftq.jobs'::regclass")
    assert seq == 0, f"{seq} sequential scans of sftq.jobs for one enqueue"
