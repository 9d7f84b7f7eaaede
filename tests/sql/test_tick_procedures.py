"""The procedures the tick's issues added (10, 11.2, 19.3): one state mapping shared with the
provider client, failure classes, bounded submissions, progress events, queue timeouts
(also against concurrent cancels), retries and the idempotency hash."""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any
from uuid import UUID

import psycopg
import pytest

from sftq_server.provider import is_known_state, map_provider_state, normalize_state

from .conftest import COUNTER_DRIFT, Q, check_code, t

DOCUMENTED = ["UNSPECIFIED", "CREATING", "PENDING", "VALIDATING", "RUNNING", "WRITING_RESULTS",
              "COMPLETED", "FAILED", "CANCELLED", "CANCELLING", "DELETING",
              "DELETING_CLEANING_UP", "EXPIRED", "EARLY_STOPPED", "PAUSED", "RE_QUEUEING",
              "CREATING_INPUT_DATASET", "IDLE", "DELETED"]


def _admitted(q: Q, gpus: int = 4, user: str = "alice") -> UUID:
    uid = q.user(user)
    job = q.enqueue(uid, gpus=gpus, at=t(0))
    assert q.admit(64, at=t(1)) == [job]
    return job


def test_sql_and_the_provider_client_map_states_alike(q: Q) -> None:
    spellings = [s for base in DOCUMENTED for s in (base, f"JOB_STATE_{base}", base.lower())]
    spellings += ["JOB_STATE_WARMING_UP", "warming_up", "  job_state_completed "]
    for state in spellings:
        sql_norm, sql_map = q.all("SELECT sftq.normalize_provider_state(%s), "
                                  "sftq.map_provider_state(%s)", state, state)[0]
        assert sql_norm == normalize_state(state), state
        python = map_provider_state(state)
        assert sql_map == (python or ("RUNNING" if is_known_state(state) else "UNKNOWN")), state
    assert q.one("SELECT sftq.map_provider_state(NULL)") is None
    assert q.one("SELECT sftq.map_provider_state('NOT_FOUND')") == "CANCELLED"


@pytest.mark.parametrize(("state", "code", "message", "expected"), [
    ("JOB_STATE_EXPIRED", None, None, "retryable"),
    ("EARLY_STOPPED", None, None, "permanent"),
    ("FAILED", "RESOURCE_EXHAUSTED", "anything", "retryable"),
    ("FAILED", "unavailable", None, "retryable"),
    ("FAILED", "INTERNAL", "invalid dataset", "retryable"),  # the code wins
    ("FAILED", "INVALID_ARGUMENT", "out of capacity", "permanent"),
    ("FAILED", "UNKNOWN", "Insufficient GPU capacity in region", "retryable"),
    ("FAILED", None, "The node was preempted", "retryable"),
    ("FAILED", "OK", "spot instance reclaimed", "retryable"),
    ("FAILED", None, "internal error, please try again", "retryable"),
    ("FAILED", None, "CUDA out of memory", "permanent"),
    ("FAILED", None, "dataset accounts/a/datasets/x not found", "permanent"),
    ("FAILED", None, "loss is NaN", "permanent"),
    ("FAILED", None, "something happened", "unknown"),
    ("FAILED", None, None, "unknown"),
])
def test_failure_classes(q: Q, state: str, code: str | None, message: str | None,
                         expected: str) -> None:
    assert q.one("SELECT sftq.failure_class_for(%s, %s, %s)", state, code, message) == expected


def test_every_fail_carries_a_class_even_from_a_path_that_names_none(q: Q) -> None:
    job = _admitted(q)
    q.conn.execute("SELECT sftq._transition(%s, 'FAIL', now(), 'admin', 'failed')", (job,))
    assert q.job(job)["failure_class"] == "unknown"


def test_submit_failures_back_off_and_run_out(q: Q) -> None:
    job = _admitted(q)
    waits = []
    for attempt in range(1, 5):
        answer = q.one("SELECT sftq.record_submit_failure(%s, 'HTTP 503', true, 4, 3600, 5, %s)",
                       job, t(10))
        assert answer["attempts"] == attempt and answer["state"] == "PROGRESS"
        assert answer["exhausted"] is (attempt == 4)
        waits.append((q.job(job)["next_submit_at"] - t(10)).total_seconds())
    assert waits == [5, 10, 20, 40]
    # The hour since admission runs out before the attempts do.
    other = _admitted(q, user="bob")
    answer = q.one("SELECT sftq.record_submit_failure(%s, 'x', true, 8, 60, 5, %s)",
                   other, t(61))
    assert answer["attempts"] == 1 and answer["exhausted"] is True
    # Backoff caps at 10 minutes.
    for _ in range(8):
        q.one("SELECT sftq.record_submit_failure(%s, 'x', true, 20, 1e9, 5, %s)", other, t(100))
    assert (q.job(other)["next_submit_at"] - t(100)).total_seconds() == 600


def test_give_up_frees_the_slot_and_says_why(q: Q) -> None:
    job = _admitted(q, gpus=8)
    for _ in range(3):
        q.one("SELECT sftq.record_submit_failure(%s, 'HTTP 503: unavailable', true, 3, 3600, 5, "
              "%s)", job, t(100))
    assert q.one("SELECT sftq.give_up_submission(%s, %s)", job, t(1801)) == "FAIL"
    row = q.job(job)
    assert row["failure_class"] == "retryable" and row["next_submit_at"] is None
    assert row["error"] == ("gave up submitting to the provider after 3 failed attempts over "
                            "1800 s; last provider answer: HTTP 503: unavailable")
    assert q.one("SELECT running_count FROM sftq.users WHERE name = 'alice'") == 0
    assert q.all("SELECT * FROM sftq.admission_budget(8, 0)") == [(8, 0, 0)]
    # Submitted, cancelled or ended meanwhile: nothing to give up.
    other = _admitted(q, user="bob")
    q.submitted(other)
    assert q.one("SELECT sftq.give_up_submission(%s)", other) == "PROGRESS"
    assert q.state(other) == "PROGRESS"
    assert q.all(COUNTER_DRIFT) == []


def test_a_final_check_that_cannot_be_made_backs_off_then_gives_up(q: Q) -> None:
    """Out of attempts, a failure recorded with no attempt left (what the tick passes for its
    final GET) counts as a failed final check, backs off like a create, and the fourth ends
    the job FAIL retryable, saying the check could not be made and why."""
    job = _admitted(q, gpus=8)
    for _ in range(3):
        q.one("SELECT sftq.record_submit_failure(%s, 'HTTP 503: unavailable', true, 3, 3600, 5, "
              "%s)", job, t(100))
    waits = []
    for check in (1, 2, 3):
        answer = q.one("SELECT sftq.record_submit_failure(%s, 'GET: timed out', true, 0, 3600, "
                       "5, %s)", job, t(200))
        assert answer == {"state": "PROGRESS", "attempts": 3, "final_checks": check,
                          "next_attempt_at": answer["next_attempt_at"], "exhausted": True}
        row = q.job(job)
        assert (row["submit_attempts"], row["last_check_failures"]) == (3, check)
        assert row["last_submit_error"] == "HTTP 503: unavailable"  # the create's answer
        waits.append((row["next_submit_at"] - t(200)).total_seconds())
    assert waits == [40, 80, 160]  # the create's backoff, going on from attempt 3
    answer = q.one("SELECT sftq.record_submit_failure(%s, 'GET: HTTP 403: denied', true, 0, "
                   "3600, 5, %s)", job, t(1801))
    assert (answer["state"], answer["final_checks"]) == ("FAIL", 4)
    row = q.job(job)
    assert (row["failure_class"], row["last_check_error"]) == ("retryable", "GET: HTTP 403: denied")
    assert row["error"] == (
        "gave up submitting to the provider after 3 failed attempts over 1800 s; last provider "
        "answer: HTTP 503: unavailable; the final check for a provider job under its id could "
        "not be made (4 tries, the last answer: GET: HTTP 403: denied)")
    events = q.all("SELECT event, detail FROM sftq.job_events WHERE job_id = %s ORDER BY id", job)
    assert [e for e, _ in events].count("final_check_failed") == 3
    assert events[-1][1]["final_check_failures"] == 4
    assert q.one("SELECT running_count FROM sftq.users WHERE name = 'alice'") == 0
    # A check that later answers 404 gives up as before: it found no job, nothing unknown.
    other = _admitted(q, user="bob")
    q.one("SELECT sftq.record_submit_failure(%s, 'x', true, 1, 3600, 5, %s)", other, t(10))
    q.one("SELECT sftq.record_submit_failure(%s, 'GET: timed out', true, 0, 3600, 5, %s)",
          other, t(20))
    assert q.one("SELECT sftq.give_up_submission(%s, %s)", other, t(30)) == "FAIL"
    assert "final check" not in q.job(other)["error"]
    assert q.all(COUNTER_DRIFT) == []


def test_skipped_creates_count_no_attempt(q: Q) -> None:
    job = _admitted(q)
    q.conn.execute("SELECT sftq.record_submit_skipped(%s, 'not attempted: down')", (job,))
    row = q.job(job)
    assert (row["submit_attempts"], row["last_submit_error"]) == (0, "not attempted: down")


def _obs(q: Q, job: UUID, **obs: Any) -> dict[str, Any]:
    answer: dict[str, Any] = q.one("SELECT sftq.observe_provider_job(%s, %s::jsonb)", job,
                                   json.dumps(obs))
    return answer


def test_progress_is_recorded_and_an_event_written_only_on_a_change(q: Q) -> None:
    job = _admitted(q)
    q.submitted(job, state="CREATING")
    cost = {"currencyCode": "USD", "units": "3"}
    steps = [
        ({"state": "PENDING", "estimated_cost": cost}, True),
        ({"state": "PENDING", "estimated_cost": cost}, False),
        ({"state": "JOB_STATE_RUNNING", "percent": 3, "epoch": 1}, True),
        ({"state": "RUNNING", "percent": 9.5, "epoch": 1}, False),  # same tenth
        ({"state": "RUNNING"}, False),  # progress left out keeps its last value
        ({"state": "RUNNING", "percent": 10, "epoch": 1}, True),
        ({"state": "RUNNING", "percent": 12, "epoch": 2}, True),
        ({"state": "RUNNING", "percent": 12, "epoch": 2,
          "estimated_cost": {"currencyCode": "USD", "units": "4"}}, True),
    ]
    for obs, changed in steps:
        answer = _obs(q, job, **obs)
        assert (answer["mapped"], answer["changed"]) == ("RUNNING", changed), obs
    row = q.job(job)
    assert (row["provider_state"], row["progress_percent"], row["progress_epoch"]) == \
        ("JOB_STATE_RUNNING", 12, 2)
    assert row["estimated_cost"] == {"currencyCode": "USD", "units": "4"}
    details = [r[0] for r in q.all("SELECT detail FROM sftq.job_events WHERE job_id = %s "
                                   "AND event = 'provider_state' ORDER BY id", job)]
    assert len(details) == 5
    assert details[0] == {"provider_state": "JOB_STATE_PENDING", "progress_percent": None,
                          "progress_epoch": None, "estimated_cost": cost}


def test_an_unknown_state_is_first_once_per_job(q: Q) -> None:
    job = _admitted(q)
    q.submitted(job)
    first = _obs(q, job, state="WARMING_UP")
    assert (first["mapped"], first["first_unknown"], first["state"]) == ("UNKNOWN", True, "PROGRESS")
    assert _obs(q, job, state="WARMING_UP")["first_unknown"] is False
    assert _obs(q, job, state="RUNNING")["mapped"] == "RUNNING"
    assert _obs(q, job, state="COOLING_DOWN")["first_unknown"] is False  # this job logged one


def test_a_failure_from_the_provider_records_its_class(q: Q) -> None:
    job = _admitted(q)
    q.submitted(job)
    answer = _obs(q, job, state="FAILED", status_code="RESOURCE_EXHAUSTED",
                  message="no capacity")
    assert answer["state"] == "FAIL"
    row = q.job(job)
    assert (row["failure_class"], row["error"]) == ("retryable", "no capacity")
    detail = q.one("SELECT detail FROM sftq.job_events WHERE job_id = %s ORDER BY id DESC "
                   "LIMIT 1", job)
    assert detail["reason"] == "provider_failed" and detail["failure_class"] == "retryable"


def test_queue_timeouts(q: Q) -> None:
    uid = q.user("alice")
    rows = [q.conn.execute("SELECT id FROM sftq.enqueue(%s, 'SFT', '{}'::jsonb, NULL, 4, NULL, "
                           "%s, %s)", (uid, t(i), timeout)).fetchone() for i, timeout in
            enumerate((60, None, 30))]
    a, b, c = (UUID(str(r[0])) for r in rows if r is not None)
    assert q.one("SELECT sftq.expire_queued(%s)", t(31)) == 0
    assert q.one("SELECT sftq.expire_queued(%s)", t(32)) == 1  # c: 2 + 30
    assert q.one("SELECT sftq.expire_queued(%s)", t(10**6)) == 1  # a; b has no timeout
    assert [q.state(j) for j in (a, b, c)] == ["CANCELLED", "QUEUED", "CANCELLED"]
    assert q.job(c)["error"] == ("timed out in the queue: still QUEUED after 30 s "
                                 "(queue_timeout_seconds 30)")
    assert q.one("SELECT head_job_id FROM sftq.users WHERE id = %s", uid) == b
    assert q.all(COUNTER_DRIFT) == []
    with pytest.raises(psycopg.Error) as caught:
        q.conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb, NULL, 4, NULL, NULL, 0)",
                       (uid,))
    check_code(caught, "SQ400")


def _timed_job(q: Q, uid: int, at: float) -> UUID:
    row = q.conn.execute("SELECT id FROM sftq.enqueue(%s, 'SFT', '{}'::jsonb, NULL, 4, NULL, "
                         "%s, 1)", (uid, t(at))).fetchone()
    assert row is not None
    return UUID(str(row[0]))


def _sweep_in_thread(db_url: str, done: list[Any]) -> threading.Thread:
    def sweep() -> None:
        with psycopg.connect(db_url, autocommit=True) as c:
            done.append(c.execute("SELECT sftq.expire_queued(%s)", (t(100),)).fetchone())

    thread = threading.Thread(target=sweep)
    thread.start()
    return thread


def test_a_queue_timeout_skips_a_job_being_cancelled(q: Q, db_url: str) -> None:
    alice, bob = q.user("alice"), q.user("bob")
    jobs = [_timed_job(q, alice, 0), _timed_job(q, bob, 1), _timed_job(q, alice, 2)]
    with psycopg.connect(db_url) as held:
        # Bob's cancel of his job, not yet committed: the sweep passes it by, without waiting.
        held.execute("SELECT * FROM sftq.cancel(%s, %s)", (bob, jobs[1]))
        done: list[Any] = []
        thread = _sweep_in_thread(db_url, done)
        thread.join(10)
        assert not thread.is_alive(), "the sweep waited for another user's cancel"
        held.commit()
    assert done == [(2,)]
    assert [q.state(j) for j in jobs] == ["CANCELLED"] * 3
    events = [r[0] for r in q.all("SELECT event FROM sftq.job_events WHERE job_id = %s "
                                  "ORDER BY id", jobs[1])]
    assert events == ["queued", "cancelled"]  # the user's cancel, not a timeout
    assert q.all(COUNTER_DRIFT) == []


def test_a_queue_timeout_racing_the_same_users_cancel_waits_and_never_deadlocks(
        q: Q, db_url: str) -> None:
    alice = q.user("alice")
    jobs = [_timed_job(q, alice, i) for i in range(3)]
    with psycopg.connect(db_url) as held:
        held.execute("SELECT * FROM sftq.cancel(%s, %s)", (alice, jobs[1]))
        done: list[Any] = []
        thread = _sweep_in_thread(db_url, done)
        # The sweep holds jobs 0 and 2 and waits for alice's user row; the cancel holds job 1
        # and that row and wants nothing the sweep holds: a wait, not a cycle.
        deadline = threading.Event()
        for _ in range(200):
            blocked = q.one("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                            "'Lock' AND query LIKE '%%expire_queued%%'")
            if blocked:
                break
            deadline.wait(0.02)
        assert blocked, "the sweep did not wait for alice's row"
        held.commit()
        thread.join(10)
        assert not thread.is_alive()
    assert done == [(2,)]
    assert [q.state(j) for j in jobs] == ["CANCELLED"] * 3
    assert q.all(COUNTER_DRIFT) == []


def test_retry_job(q: Q) -> None:
    alice, bob = q.user("alice"), q.user("bob")
    job = q.enqueue(alice, "DPO", 8, payload={"dataset": "d", "x": 1}, name="n")
    q.conn.execute("SELECT * FROM sftq.cancel(%s, %s)", (alice, job))
    row = q.all("SELECT id, kind, state, replayed, retry_of FROM sftq.retry_job(%s, %s, 'k')",
                alice, job)[0]
    new, kind, state, replayed, retry_of = row
    assert (kind, state, replayed, retry_of) == ("DPO", "QUEUED", False, job)
    again = q.all("SELECT id, replayed FROM sftq.retry_job(%s, %s, 'k')", alice, job)[0]
    assert again == (new, True)
    copy = q.job(new)
    assert (copy["fireworks_payload"], copy["display_name"], copy["gpu_count"]) == \
        ({"dataset": "d", "x": 1}, "n", 8)
    for user, target, code in ((bob, job, "SQ404"), (alice, new, "SQ439")):
        with pytest.raises(psycopg.Error) as caught:
            q.all("SELECT * FROM sftq.retry_job(%s, %s)", user, target)
        check_code(caught, code)
    # The key is bound to that retry: reused for another request it is a conflict.
    with pytest.raises(psycopg.Error) as caught:
        q.all("SELECT * FROM sftq.enqueue(%s, 'DPO', %s::jsonb, 'n', 8, 'k')", alice,
              json.dumps({"dataset": "d", "x": 1}))
    check_code(caught, "SQ419")


def test_the_idempotency_hash_of_a_plain_submit_is_unchanged(q: Q) -> None:
    # Keys stored before queue timeouts existed must still replay: same hash input.
    uid = q.user("alice")
    job = q.enqueue(uid, "SFT", 4, payload={"a": 1}, name="n", key="old")
    stored = bytes(q.one("SELECT request_hash FROM sftq.jobs WHERE id = %s", job))
    text = q.one("SELECT jsonb_build_array('SFT'::text, '{\"a\": 1}'::jsonb, 'n'::text, 4)::text")
    assert stored == hashlib.sha256(text.encode()).digest()
