"""The contract of each procedure, errors included."""

from __future__ import annotations

import hashlib
from uuid import uuid4

import psycopg
import pytest

from .conftest import Q, check_code, t


def sha(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


# -- users and keys -----------------------------------------------------------------


def test_create_user_rejects_duplicates_and_bad_names(q: Q) -> None:
    q.user("alice")
    with pytest.raises(psycopg.Error) as e:
        q.user("alice")
    check_code(e, "SQ423")
    with pytest.raises(psycopg.Error) as e:
        q.user("bad name!")
    check_code(e, "SQ400")
    assert q.one("SELECT max_running FROM sftq.users WHERE name = 'alice'") == 1


def test_keys_are_stored_hashed_and_can_be_revoked(q: Q) -> None:
    uid = q.user("alice")
    key, prefix = q.all("SELECT key, prefix FROM sftq.issue_key('alice')")[0]
    assert key.startswith("sftq_") and len(key) == 53 and prefix == key[:13]
    stored = q.all("SELECT key_hash, prefix FROM sftq.api_keys")
    assert stored == [(sha(key), prefix)]
    assert key not in str(q.all("SELECT * FROM sftq.api_keys"))
    assert q.one("SELECT sftq.authenticate(%s)", sha(key)) == uid
    assert q.one("SELECT last_used_at IS NOT NULL FROM sftq.api_keys")
    assert q.one("SELECT sftq.authenticate(%s)", sha(key + "x")) is None
    assert q.one("SELECT sftq.revoke_key(%s)", prefix) == 1
    assert q.one("SELECT sftq.authenticate(%s)", sha(key)) is None
    with pytest.raises(psycopg.Error) as e:
        q.one("SELECT sftq.revoke_key(%s)", prefix)
    check_code(e, "SQ404")


def test_ambiguous_prefix_is_refused(q: Q) -> None:
    q.user("alice")
    q.all("SELECT * FROM sftq.issue_key('alice')")
    q.all("SELECT * FROM sftq.issue_key('alice')")
    with pytest.raises(psycopg.Error) as e:
        q.one("SELECT sftq.revoke_key('sftq_')")
    check_code(e, "SQ400")
    q.conn.execute("UPDATE sftq.api_keys SET prefix = 'sftq_aaaa1111'")
    with pytest.raises(psycopg.Error) as e:
        q.one("SELECT sftq.revoke_key('sftq_aaaa')")
    check_code(e, "SQ409")


def test_disabled_user_cannot_authenticate_or_enqueue(q: Q) -> None:
    uid = q.user("alice")
    key = q.one("SELECT key FROM sftq.issue_key('alice')")
    q.one("SELECT sftq.set_user_disabled('alice', true)")
    assert q.one("SELECT sftq.authenticate(%s)", sha(key)) is None
    with pytest.raises(psycopg.Error) as e:
        q.enqueue(uid)
    check_code(e, "SQ401")


# -- enqueue ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "payload", "gpus", "name", "message"),
    [
        ("XYZ", {"a": 1}, 4, None, "kind must be one of"),
        ("SFT", None, 4, None, "fireworks_payload is required"),
        ("SFT", [1, 2], 4, None, "must be a JSON object"),
        ("SFT", {"a": 1}, 0, None, "gpu_count"),
        ("SFT", {"a": 1}, 65, None, "gpu_count"),
        ("SFT", {"a": 1}, 4, "x" * 257, "display_name"),
    ],
)
def test_enqueue_validates(
    q: Q, kind: str, payload: object, gpus: int, name: str | None, message: str
) -> None:
    uid = q.user("alice")
    import json

    with pytest.raises(psycopg.Error) as e:
        q.conn.execute(
            "SELECT * FROM sftq.enqueue(%s, %s, %s::jsonb, %s, %s)",
            (uid, kind, None if payload is None else json.dumps(payload), name, gpus),
        )
    check_code(e, "SQ400")
    assert message in str(e.value)
    assert q.one("SELECT count(*) FROM sftq.jobs") == 0


def test_enqueue_defaults_and_counters(q: Q) -> None:
    uid = q.user("alice")
    j1 = q.enqueue(uid, at=t(2))
    j0 = q.enqueue(uid, at=t(1))  # an earlier created_at becomes the head
    row = q.job(j1)
    assert row["state"] == "QUEUED" and row["gpu_count"] == 4 and row["started_at"] is None
    assert q.all("SELECT queued_count, running_count, head_job_id FROM sftq.users") == [(2, 0, j0)]


def test_idempotency_key_replays_and_conflicts(q: Q) -> None:
    uid, other = q.user("alice"), q.user("bob")
    first = q.all(
        "SELECT id, replayed FROM sftq.enqueue(%s, 'SFT', '{\"a\":1}', 'n', 4, 'k')", uid
    )[0]
    again = q.all(
        "SELECT id, replayed FROM sftq.enqueue(%s, 'SFT', '{\"a\":1}', 'n', 4, 'k')", uid
    )[0]
    assert first[0] == again[0] and (first[1], again[1]) == (False, True)
    with pytest.raises(psycopg.Error) as e:
        q.all("SELECT * FROM sftq.enqueue(%s, 'SFT', '{\"a\":2}', 'n', 4, 'k')", uid)
    check_code(e, "SQ419")
    # Keys are per user.
    theirs = q.all(
        "SELECT id, replayed FROM sftq.enqueue(%s, 'SFT', '{\"a\":1}', 'n', 4, 'k')", other
    )[0]
    assert theirs[0] != first[0] and theirs[1] is False
    assert q.one("SELECT count(*) FROM sftq.jobs") == 2
    assert q.one("SELECT queued_count FROM sftq.users WHERE id = %s", uid) == 1


# -- state machine ------------------------------------------------------------------


def test_transitions_set_timestamps_and_write_events(q: Q) -> None:
    uid = q.user("alice")
    job = q.enqueue(uid, at=t(0))
    assert q.admit(8, at=t(10)) == [job]
    row = q.job(job)
    assert row["state"] == "PROGRESS" and row["started_at"] == t(10) and row["completed_at"] is None
    q.submitted(job, at=t(11))
    assert q.provider_state(job, "JOB_STATE_COMPLETED", at=t(100)) == "SUCCESS"
    row = q.job(job)
    assert row["completed_at"] == t(100)
    assert q.events(job) == [
        ("queued", None, None),
        ("admitted", "QUEUED", "PROGRESS"),
        ("submitted", "PROGRESS", None),
        ("succeeded", "PROGRESS", "SUCCESS"),
    ]
    # Every row says the job's state right after it; the history starts at enqueue.
    assert q.all("SELECT state, at FROM sftq.job_events WHERE job_id = %s ORDER BY id", job) == [
        ("QUEUED", t(0)), ("PROGRESS", t(10)), ("PROGRESS", t(11)), ("SUCCESS", t(100))
    ]
    assert q.all("SELECT running_count, queued_count, head_job_id FROM sftq.users") == [
        (0, 0, None)
    ]


@pytest.mark.parametrize(
    ("start", "to"),
    [
        ("QUEUED", "SUCCESS"),
        ("QUEUED", "FAIL"),
        ("PROGRESS", "QUEUED"),
        ("SUCCESS", "PROGRESS"),
        ("FAIL", "QUEUED"),
        ("CANCELLED", "QUEUED"),
        ("SUCCESS", "CANCELLED"),
        ("CANCELLED", "PROGRESS"),
    ],
)
def test_illegal_transitions_are_rejected(q: Q, start: str, to: str) -> None:
    uid = q.user("alice")
    job = q.enqueue(uid)
    if start != "QUEUED":
        q.admit(64)
    if start == "SUCCESS":
        q.provider_state(job, "JOB_STATE_COMPLETED")
    if start == "FAIL":
        q.provider_state(job, "JOB_STATE_FAILED")
    if start == "CANCELLED":
        q.provider_state(job, "JOB_STATE_CANCELLED")
    assert q.state(job) == start
    with pytest.raises(psycopg.Error) as e:
        q.one("SELECT (sftq._transition(%s, %s, now(), 'test', 'x')).state", job, to)
    check_code(e, "SQ409")
    # Even a hand-written UPDATE cannot do it.
    with pytest.raises(psycopg.Error) as e:
        q.conn.execute(
            "UPDATE sftq.jobs SET state = %s, completed_at = now() WHERE id = %s", (to, job)
        )
    assert e.value.sqlstate in ("SQ422", "23514")
    assert q.state(job) == start


def test_timestamps_cannot_be_set_by_callers(q: Q) -> None:
    uid = q.user("alice")
    job = q.enqueue(uid)
    with pytest.raises(psycopg.Error) as e:
        q.conn.execute("UPDATE sftq.jobs SET started_at = now() WHERE id = %s", (job,))
    check_code(e, "SQ422")


# -- list and get -------------------------------------------------------------------


def test_list_is_newest_first_filtered_and_keyset_paged(q: Q) -> None:
    uid, other = q.user("alice"), q.user("bob")
    jobs = [
        q.enqueue(uid, kind=k, at=t(i)) for i, k in enumerate(["SFT", "DPO", "RFT", "SFT", "DPO"])
    ]
    q.enqueue(other, at=t(99))
    listed = [r[0] for r in q.all("SELECT id FROM sftq.list_jobs(%s)", uid)]
    assert listed == list(reversed(jobs))
    assert [r[0] for r in q.all("SELECT id FROM sftq.list_jobs(%s, NULL, 'DPO')", uid)] == [
        jobs[4],
        jobs[1],
    ]
    q.admit(64)
    assert [r[0] for r in q.all("SELECT id FROM sftq.list_jobs(%s, 'PROGRESS')", uid)] == [jobs[0]]
    page1 = q.all("SELECT id, created_at FROM sftq.list_jobs(%s, NULL, NULL, 2)", uid)
    page2 = q.all(
        "SELECT id FROM sftq.list_jobs(%s, NULL, NULL, 2, %s, %s)", uid, page1[-1][1], page1[-1][0]
    )
    assert [r[0] for r in page1 + page2] == list(reversed(jobs))[:4]
    for bad in ("state", "kind", "limit"):
        args = {"state": ("NOPE", None, 10), "kind": (None, "NOPE", 10), "limit": (None, None, 0)}[
            bad
        ]
        with pytest.raises(psycopg.Error) as e:
            q.all("SELECT * FROM sftq.list_jobs(%s, %s, %s, %s)", uid, *args)
        check_code(e, "SQ400")


def test_get_does_not_leak_other_users_jobs(q: Q) -> None:
    uid, other = q.user("alice"), q.user("bob")
    job = q.enqueue(uid)
    assert q.one("SELECT (sftq.get_job(%s, %s)).id", uid, job) == job
    for who, what in ((other, job), (uid, uuid4())):
        with pytest.raises(psycopg.Error) as e:
            q.one("SELECT (sftq.get_job(%s, %s)).id", who, what)
        check_code(e, "SQ404")
        assert str(e.value).startswith("job not found")


# -- cancel -------------------------------------------------------------------------


def test_cancel_queued_is_immediate(q: Q) -> None:
    uid = q.user("alice")
    job = q.enqueue(uid)
    assert q.all("SELECT state, action FROM sftq.cancel(%s, %s)", uid, job) == [
        ("CANCELLED", "none")
    ]
    assert q.job(job)["completed_at"] is not None
    assert q.all("SELECT queued_count, head_job_id FROM sftq.users") == [(0, None)]


@pytest.mark.parametrize(
    ("kind", "action"),
    [("SFT", "provider_delete"), ("DPO", "provider_delete"), ("RFT", "provider_cancel")],
)
def test_cancel_progress_names_the_provider_call(q: Q, kind: str, action: str) -> None:
    uid = q.user("alice")
    job = q.enqueue(uid, kind=kind)
    q.admit(8)
    q.submitted(job)
    assert q.all("SELECT state, action FROM sftq.cancel(%s, %s)", uid, job) == [
        ("PROGRESS", action)
    ]
    assert q.job(job)["cancel_requested_at"] is not None
    # Asking again is harmless and gives the same answer (the API may retry).
    assert q.all("SELECT state, action FROM sftq.cancel(%s, %s)", uid, job) == [
        ("PROGRESS", action)
    ]
    assert q.one("SELECT sftq.complete_cancel(%s)", job) == "CANCELLED"
    assert q.one("SELECT sftq.complete_cancel(%s)", job) == "CANCELLED"  # idempotent
    assert [e[0] for e in q.events(job)] == [
        "queued",
        "admitted",
        "submitted",
        "cancel_requested",
        "cancelled",
    ]
    assert q.one("SELECT running_count FROM sftq.users") == 0


def test_cancel_unsubmitted_progress_is_deferred_to_the_scheduler(q: Q) -> None:
    uid = q.user("alice")
    job = q.enqueue(uid)
    q.admit(8)
    assert q.all("SELECT action FROM sftq.cancel(%s, %s)", uid, job) == [("deferred",)]
    # The create that was in flight lands: the scheduler is told to stop it.
    assert q.submitted(job) == "stop"


def test_cancel_terminal_or_foreign_is_refused(q: Q) -> None:
    uid, other = q.user("alice"), q.user("bob")
    job = q.enqueue(uid)
    q.all("SELECT * FROM sftq.cancel(%s, %s)", uid, job)
    with pytest.raises(psycopg.Error) as e:
        q.all("SELECT * FROM sftq.cancel(%s, %s)", uid, job)
    check_code(e, "SQ409")
    with pytest.raises(psycopg.Error) as e:
        q.all("SELECT * FROM sftq.cancel(%s, %s)", other, job)
    check_code(e, "SQ404")
    with pytest.raises(psycopg.Error) as e:
        q.one("SELECT sftq.complete_cancel(%s)", uuid4())
    check_code(e, "SQ404")


def test_complete_cancel_requires_a_request(q: Q) -> None:
    uid = q.user("alice")
    job = q.enqueue(uid)
    q.admit(8)
    with pytest.raises(psycopg.Error) as e:
        q.one("SELECT sftq.complete_cancel(%s)", job)
    check_code(e, "SQ409")


# -- provider outcomes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "ours", "event"),
    [
        ("JOB_STATE_COMPLETED", "SUCCESS", "succeeded"),
        ("JOB_STATE_FAILED", "FAIL", "failed"),
        ("JOB_STATE_EXPIRED", "FAIL", "failed"),
        ("JOB_STATE_EARLY_STOPPED", "FAIL", "failed"),
        # Folded into 'cancelled' (detail.reason says it happened outside the queue).
        ("JOB_STATE_CANCELLED", "CANCELLED", "cancelled"),
        ("JOB_STATE_DELETED", "CANCELLED", "cancelled"),
        ("NOT_FOUND", "CANCELLED", "cancelled"),
        ("JOB_STATE_RUNNING", "PROGRESS", "provider_state"),
        ("JOB_STATE_PAUSED", "PROGRESS", "provider_state"),
        ("JOB_STATE_SOMETHING_NEW", "PROGRESS", "provider_state"),
    ],
)
def test_provider_state_mapping(q: Q, provider: str, ours: str, event: str) -> None:
    uid = q.user("alice")
    job = q.enqueue(uid)
    q.admit(8)
    q.submitted(job, state="JOB_STATE_CREATING")
    assert q.provider_state(job, provider, "boom") == ours
    assert q.events(job)[-1][0] == event
    row = q.job(job)
    assert row["provider_state"] == provider
    if ours == "FAIL":
        assert row["error"] == "boom"
    if ours == "CANCELLED":
        assert "outside the queue" in row["error"]
        reason = q.one(
            "SELECT detail->>'reason' FROM sftq.job_events WHERE job_id = %s ORDER BY id DESC LIMIT 1",
            job,
        )
        assert reason == ("cancelled_outside" if provider == "JOB_STATE_CANCELLED" else "deleted_outside")
    # A finished job ignores later reports.
    if ours != "PROGRESS":
        assert q.provider_state(job, "JOB_STATE_RUNNING") == ours


def test_rejected_submission_fails_with_the_body_verbatim(q: Q) -> None:
    uid = q.user("alice")
    job = q.enqueue(uid)
    q.admit(8)
    body = '{"code": 3, "message": "dataset is required", "details": []}'
    assert q.one("SELECT sftq.record_submit_error(%s, %s, false)", job, body) == "FAIL"
    assert q.job(job)["error"] == body
    # Folded into 'failed' (detail.reason says the create was refused).
    assert q.events(job)[-1] == ("failed", "PROGRESS", "FAIL")
    detail = q.one("SELECT detail FROM sftq.job_events WHERE job_id = %s ORDER BY id DESC LIMIT 1", job)
    assert detail["reason"] == "submission_rejected" and detail["failure_class"] == "permanent"
    assert q.job(job)["failure_class"] == "permanent"


def test_transient_submission_error_keeps_the_job_with_a_visible_reason(q: Q) -> None:
    uid = q.user("alice")
    job = q.enqueue(uid)
    q.admit(8)
    for _ in range(3):
        assert q.one("SELECT sftq.record_submit_error(%s, 'HTTP 503', true)", job) == "PROGRESS"
    row = q.job(job)
    assert (row["state"], row["submit_attempts"], row["last_submit_error"]) == (
        "PROGRESS",
        3,
        "HTTP 503",
    )
    assert q.submitted(job) == "ok"
    assert q.job(job)["last_submit_error"] is None


def test_provider_job_id_is_deterministic_and_valid(q: Q) -> None:
    import re

    job = uuid4()
    pid = q.one("SELECT sftq.provider_job_id(%s)", job)
    assert pid == f"sftq-{job.hex}" and re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", pid)


# -- ticks --------------------------------------------------------------------------


def test_tick_lease_is_exclusive_and_expires(q: Q) -> None:
    first = q.one("SELECT sftq.tick_begin('a', interval '1 minute', %s)", t(0))
    assert first is not None
    assert q.one("SELECT sftq.tick_begin('b', interval '1 minute', %s)", t(30)) is None
    # The first tick died: after its lease expires, another may run; the dead one is marked.
    second = q.one("SELECT sftq.tick_begin('b', interval '1 minute', %s)", t(61))
    assert second is not None and second != first
    assert q.one("SELECT status FROM sftq.scheduler_ticks WHERE id = %s", first) == "abandoned"
    q.one(
        "SELECT sftq.tick_finish(%s, %s::jsonb)::text",
        second,
        '{"quota_limit": 16, "quota_usage": 4, "budget": 12, "admitted": 1, "errors": []}',
    )
    assert q.all(
        "SELECT status, quota_limit, budget, admitted FROM sftq.scheduler_ticks WHERE id = %s",
        second,
    ) == [("ok", 16, 12, 1)]
    assert q.one("SELECT sftq.tick_begin('c')") is not None
