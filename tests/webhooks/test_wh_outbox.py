"""The outbox and the deliverers' procedures, straight in SQL: a delivery row per (event,
subscribed enabled endpoint) in the event's own transaction, the type mapping, the claim
(SKIP LOCKED, leases, the per-endpoint bound), the retry schedule and disabling."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from fn_support import SFT_PAYLOAD, Db

Conn = psycopg.Connection[Any]
T0 = datetime.fromisoformat("2026-06-01T12:00:00+00:00")


def uid(db: Db, name: str) -> int:
    return int(db.one("SELECT id FROM sftq.users WHERE name = %s", name))


def endpoint(db: Db, user: str, events: list[str], url: str = "https://hooks.example.com/h"
             ) -> str:
    eid = str(uuid.uuid4())
    db.conn.execute("SELECT sftq.webhook_create(%s, %s, %s, %s, NULL, 'v0:whsec_x')",
                    (uid(db, user), eid, url, events))
    return eid


def enqueue(db: Db, user: str, payload: dict[str, Any] | None = None) -> str:
    return str(db.one("SELECT id FROM sftq.enqueue(%s, 'SFT', %s::jsonb)", uid(db, user),
                      json.dumps(payload or SFT_PAYLOAD)))


def deliveries(db: Db, endpoint_id: str | None = None) -> list[dict[str, Any]]:
    rows = db.conn.execute(
        "SELECT endpoint_id::text, type, job_id::text, body, webhook_id, state, event_id"
        "  FROM sftq.webhook_deliveries WHERE %s::uuid IS NULL OR endpoint_id = %s::uuid"
        " ORDER BY id", (endpoint_id, endpoint_id)).fetchall()
    return [dict(zip(("endpoint", "type", "job", "body", "webhook_id", "state", "event_id"), r,
                     strict=True)) for r in rows]


def types(db: Db, endpoint_id: str) -> list[str]:
    return [d["type"] for d in deliveries(db, endpoint_id)]


def claim(conn: Conn, limit: int = 10, per_endpoint: int = 4, now: datetime | None = None,
          lease: int = 60) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT delivery_id, lease_token, endpoint_id::text, webhook_id, type, attempt"
        "  FROM sftq.webhook_claim(%s, %s, make_interval(secs => %s),"
        "                          COALESCE(%s, clock_timestamp()))",
        (limit, per_endpoint, lease, now)).fetchall()


def record(conn: Conn, row: tuple[Any, ...], status: int | None, now: datetime | None = None,
           error: str | None = None) -> str:
    return str(conn.execute(
        "SELECT sftq.webhook_record_attempt(%s, %s, %s, %s, 5, NULL,"
        " COALESCE(%s, clock_timestamp()))",
        (row[0], row[1], status, error, now)).fetchone()[0])  # type: ignore[index]


# --- the outbox -----------------------------------------------------------------------------

def test_every_event_type_reaches_the_endpoints_subscribed_to_it(db: Db, alice: str) -> None:
    everything = endpoint(db, "alice", ["job.*"])
    terminal = endpoint(db, "alice", ["job.succeeded", "job.failed", "job.cancelled"])
    queued_only = endpoint(db, "alice", ["job.queued"])
    disabled = endpoint(db, "alice", ["job.*"])
    db.conn.execute("SELECT sftq._webhook_disable(%s, 'test', now())", (disabled,))

    ok = enqueue(db, "alice")                        # job.queued
    db.admit()                                       # job.admitted
    db.submitted(ok)                                 # submitted: no webhook
    db.provider_state(ok, "JOB_STATE_RUNNING")       # provider_state: no webhook
    db.provider_state(ok, "JOB_STATE_COMPLETED", after=60)   # job.succeeded
    failing = enqueue(db, "alice")
    db.admit(after=61)
    db.submitted(failing)
    db.provider_state(failing, "JOB_STATE_FAILED", "boom", after=120)  # job.failed
    rejected = enqueue(db, "alice")
    db.admit(after=121)
    db.conn.execute("SELECT sftq.record_submit_error(%s, 'bad payload', false, "
                    "now() + interval '130 seconds')", (rejected,))
    cancelled = enqueue(db, "alice")
    db.conn.execute("SELECT * FROM sftq.cancel(%s, %s)", (uid(db, "alice"), cancelled))

    assert types(db, everything) == [
        "job.queued", "job.admitted", "job.succeeded", "job.queued", "job.admitted",
        "job.failed", "job.queued", "job.admitted", "job.failed", "job.queued",
        "job.cancelled"]
    assert types(db, terminal) == ["job.succeeded", "job.failed", "job.failed", "job.cancelled"]
    assert types(db, queued_only) == ["job.queued"] * 4
    assert types(db, disabled) == []
    # Each delivery names its event and job; webhook ids are unique.
    rows = deliveries(db)
    assert len({r["webhook_id"] for r in rows}) == len(rows)
    for r in rows:
        event = db.conn.execute("SELECT job_id::text, state FROM sftq.job_events WHERE id = %s",
                                (r["event_id"],)).fetchone()
        assert event is not None and event[0] == r["job"]


def test_terminal_types_follow_the_state_whatever_the_event_is_called(db: Db) -> None:
    one = db.conn.execute
    assert [one("SELECT sftq.webhook_type(%s, %s)", (e, s)).fetchone()[0]  # type: ignore[index]
            for e, s in [("queued", None), ("admitted", "PROGRESS"), ("succeeded", "SUCCESS"),
                         ("failed", "FAIL"), ("submission_rejected", "FAIL"),
                         ("queue_timeout", "CANCELLED"), ("reconciled", "CANCELLED"),
                         ("anything_new", "SUCCESS"), ("provider_state", None),
                         ("submitted", None), ("retried", None)]] == [
        "job.queued", "job.admitted", "job.succeeded", "job.failed", "job.failed",
        "job.cancelled", "job.cancelled", "job.succeeded", None, None, None]


def test_the_body_is_the_job_record_at_the_event(db: Db, alice: str) -> None:
    e = endpoint(db, "alice", ["job.*"])
    job = enqueue(db, "alice")
    db.admit()
    db.submitted(job)
    db.provider_state(job, "JOB_STATE_COMPLETED", after=60)
    bodies = [json.loads(d["body"]) for d in deliveries(db, e)]
    assert [b["type"] for b in bodies] == ["job.queued", "job.admitted", "job.succeeded"]
    assert [b["data"]["state"] for b in bodies] == ["QUEUED", "PROGRESS", "SUCCESS"]
    now = json.loads(db.one("SELECT sftq.job_json(j)::text FROM sftq.jobs j WHERE id = %s", job))
    assert bodies[-1]["data"] == now  # the record exactly as GET /jobs/{id} shows it
    assert bodies[0]["data"]["started_at"] is None and bodies[1]["data"]["completed_at"] is None
    events = db.conn.execute("SELECT sftq._iso(at) FROM sftq.job_events WHERE job_id = %s "
                             "AND event IN ('queued', 'admitted', 'succeeded') ORDER BY id",
                             (job,)).fetchall()
    assert [b["timestamp"] for b in bodies] == [r[0] for r in events]
    # The payload, and the secret inside it, never reaches a webhook body.
    for d in deliveries(db, e):
        assert "wandb-SECRET" not in d["body"] and "fireworks_payload" not in d["body"]


def test_written_in_the_events_transaction(db: Db, alice: str, db_url: str) -> None:
    e = endpoint(db, "alice", ["job.*"])
    with psycopg.connect(db_url) as conn:  # not autocommit: one transaction
        conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid(db, "alice"),))
        inside = conn.execute("SELECT count(*) FROM sftq.webhook_deliveries").fetchone()
        assert inside == (1,)
        assert deliveries(db, e) == []  # not visible before the commit
        conn.rollback()
    assert deliveries(db, e) == []  # and gone with the rollback
    assert db.one("SELECT count(*) FROM sftq.jobs") == 0
    with psycopg.connect(db_url) as conn:
        conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid(db, "alice"),))
        conn.commit()
    assert types(db, e) == ["job.queued"]


def test_no_endpoints_no_rows_and_no_crossing_users(db: Db, alice: str, bob: str) -> None:
    e = endpoint(db, "alice", ["job.*"])
    for _ in range(3):
        enqueue(db, "bob")
    db.admit()
    assert deliveries(db) == []
    assert db.one("SELECT webhook_count FROM sftq.users WHERE name = 'bob'") == 0
    assert db.one("SELECT webhook_count FROM sftq.users WHERE name = 'alice'") == 1
    enqueue(db, "alice")
    assert [d["endpoint"] for d in deliveries(db)] == [e]


def test_the_scheduler_role_runs_a_cycle_for_a_user_with_endpoints(db: Db, alice: str) -> None:
    e = endpoint(db, "alice", ["job.*"])
    job = enqueue(db, "alice")
    db.conn.execute("SET ROLE sftq_scheduler")
    try:
        db.conn.execute("SELECT sftq.admit_for_quota(16, 0)")
        db.conn.execute("SELECT sftq.record_submitted(%s, 'accounts/x/dpoJobs/y', "
                        "'JOB_STATE_RUNNING')", (job,))
        db.conn.execute("SELECT sftq.record_provider_state(%s, 'JOB_STATE_COMPLETED', NULL)",
                        (job,))
        rows = claim(db.conn)
        assert len(rows) == 3
        assert record(db.conn, rows[0], 204) == "succeeded"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            db.conn.execute("SELECT secret_sealed FROM sftq.webhook_endpoints")
    finally:
        db.conn.execute("RESET ROLE")
    assert types(db, e) == ["job.queued", "job.admitted", "job.succeeded"]


@pytest.mark.parametrize("role", ["sftq_analyst", "sftq_api"])
def test_other_roles_cannot_read_webhook_tables(db: Db, alice: str, role: str) -> None:
    endpoint(db, "alice", ["job.*"])
    enqueue(db, "alice")
    db.conn.execute(f"SET ROLE {role}")
    try:
        for table in ("webhook_endpoints", "webhook_deliveries", "webhook_attempts"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.conn.execute(f"SELECT * FROM sftq.{table}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            db.conn.execute("SELECT * FROM sftq.webhook_claim(10)")
    finally:
        db.conn.execute("RESET ROLE")


def test_no_analyst_view_shows_webhook_secrets_or_urls(db: Db, alice: str) -> None:
    endpoint(db, "alice", ["job.*"], url="https://hooks.example.com/h?token=URLSECRET")
    enqueue(db, "alice")
    views = [r[0] for r in db.conn.execute(
        "SELECT table_name FROM information_schema.views WHERE table_schema = 'sftq' "
        "AND table_name LIKE 'analyst%'").fetchall()]
    assert views
    for view in views:
        text = json.dumps([list(map(str, r)) for r in
                           db.conn.execute(f"SELECT * FROM sftq.{view}").fetchall()])
        assert "whsec_" not in text and "URLSECRET" not in text and "v0:" not in text, view


def test_the_cap_holds_under_concurrent_creates(db: Db, alice: str, db_url: str) -> None:
    user = uid(db, "alice")
    errors: list[str] = []

    def add() -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            try:
                conn.execute("SELECT sftq.webhook_create(%s, gen_random_uuid(), "
                             "'https://h.example.com/', ARRAY['job.*'], NULL, 'v0:x')", (user,))
            except psycopg.Error as exc:
                errors.append(exc.sqlstate or "")

    threads = [threading.Thread(target=add) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert db.one("SELECT count(*) FROM sftq.webhook_endpoints") == 10
    assert db.one("SELECT webhook_count FROM sftq.users WHERE id = %s", user) == 10
    assert errors == ["SQ440"] * 6


# --- claiming -------------------------------------------------------------------------------

def test_claims_never_overlap_and_respect_the_per_endpoint_bound(db: Db, alice: str, bob: str,
                                                                 db_url: str) -> None:
    busy = endpoint(db, "alice", ["job.queued"])
    other = endpoint(db, "bob", ["job.queued"])
    for _ in range(10):
        enqueue(db, "alice")
    enqueue(db, "bob")
    with psycopg.connect(db_url) as a, psycopg.connect(db_url) as b:
        first = claim(a, limit=3, per_endpoint=2)   # a's transaction stays open: rows locked
        second = claim(b, limit=10, per_endpoint=2)
        a.commit()
        b.commit()
    ids = [r[0] for r in first + second]
    assert len(ids) == len(set(ids))
    # Two of alice's (her cap) went to the first claimer with bob's; the second claimer saw
    # alice's other due rows but her endpoint was at its bound once the first committed...
    per = {e: sum(1 for r in first + second if r[2] == e) for e in (busy, other)}
    assert per[other] == 1
    assert 2 <= per[busy] <= 4  # ... or not yet (two claimers at once may each take the bound)
    # Now both leases are held: nothing more for alice until one ends.
    more = claim(db.conn, limit=10, per_endpoint=2)
    assert [r for r in more if r[2] == busy] == []
    record(db.conn, next(r for r in first + second if r[2] == busy), 204)
    again = claim(db.conn, limit=10, per_endpoint=per[busy] - 1 + 1)
    assert len([r for r in again if r[2] == busy]) == 1


def test_a_lease_that_runs_out_makes_the_row_due_again(db: Db, alice: str) -> None:
    endpoint(db, "alice", ["job.queued"])
    enqueue(db, "alice")
    now = datetime.now(T0.tzinfo) + timedelta(seconds=1)
    (first,) = claim(db.conn, now=now, lease=30)
    assert claim(db.conn, now=now + timedelta(seconds=29)) == []
    (second,) = claim(db.conn, now=now + timedelta(seconds=31), lease=30)
    assert second[0] == first[0] and second[1] != first[1]
    assert second[3] == first[3]  # the same webhook-id
    # The first holder's late failure is history only; its late success would still count.
    assert record(db.conn, first, 503, now=now + timedelta(seconds=32)) == "stale"
    assert db.one("SELECT state FROM sftq.webhook_deliveries WHERE id = %s", first[0]) == "pending"
    assert record(db.conn, first, 200, now=now + timedelta(seconds=33)) == "stale"
    assert db.one("SELECT state FROM sftq.webhook_deliveries WHERE id = %s", first[0]) == \
        "succeeded"
    assert record(db.conn, second, 204, now=now + timedelta(seconds=34)) == "stale"
    assert db.one("SELECT count(*) FROM sftq.webhook_attempts WHERE delivery_id = %s",
                  first[0]) == 3


# --- what happens after an attempt ----------------------------------------------------------

def test_the_retry_schedule(db: Db) -> None:
    created = T0
    steps = [timedelta(seconds=5), timedelta(minutes=5), timedelta(minutes=30),
             timedelta(hours=2), timedelta(hours=5), timedelta(hours=10),
             timedelta(days=1), timedelta(days=1)]
    now = created
    for failures, step in enumerate(steps, start=1):
        nxt = db.one("SELECT sftq.webhook_retry_at(%s, %s, %s)", created, failures, now)
        assert nxt == now + step, failures
        now = nxt
    # The next daily try would fall after 3 days: it is clipped to 3 days, then we give up.
    last = db.one("SELECT sftq.webhook_retry_at(%s, 9, %s)", created, now)
    assert last == created + timedelta(days=3)
    assert db.one("SELECT sftq.webhook_retry_at(%s, 10, %s)", created, last) is None


def _one_due(db: Db, events: list[str] | None = None) -> tuple[str, str]:
    e = endpoint(db, "alice", events or ["job.queued"])
    job = enqueue(db, "alice")
    db.conn.execute("UPDATE sftq.webhook_deliveries SET created_at = %s, next_attempt_at = %s",
                    (T0, T0))
    return e, job


def _endpoint_state(db: Db, e: str) -> tuple[Any, Any]:
    row = db.conn.execute("SELECT disabled_at, disabled_reason FROM sftq.webhook_endpoints "
                          "WHERE id = %s", (e,)).fetchone()
    assert row is not None
    return row[0], row[1]


def test_failures_are_retried_then_the_endpoint_is_disabled_with_a_reason(db: Db,
                                                                          alice: str) -> None:
    e, _ = _one_due(db)
    now = T0
    results = []
    webhook_ids = set()
    while True:
        rows = claim(db.conn, now=now)
        assert len(rows) == 1
        webhook_ids.add(rows[0][3])
        result = record(db.conn, rows[0], 503, now=now + timedelta(milliseconds=10),
                        error="HTTP 503 Service Unavailable")
        results.append(result)
        if result != "retrying":
            break
        now = db.one("SELECT next_attempt_at FROM sftq.webhook_deliveries")
        assert claim(db.conn, now=now - timedelta(milliseconds=1)) == []  # not due before
    assert results == ["retrying"] * 9 + ["disabled"]
    assert len(webhook_ids) == 1
    disabled_at, reason = _endpoint_state(db, e)
    assert disabled_at is not None
    assert "3 days" in reason and "10 attempts" in reason and "HTTP 503" in reason
    # Later events no longer write deliveries to it; it says why in the API's JSON.
    enqueue(db, "alice")
    assert len(deliveries(db, e)) == 1
    shown = json.loads(db.one("SELECT sftq.webhook_endpoint_json(e)::text "
                              "FROM sftq.webhook_endpoints e WHERE id = %s", e))
    assert shown["enabled"] is False and shown["disabled_reason"] == reason


@pytest.mark.parametrize(("status", "result", "state", "disabled"), [
    (200, "succeeded", "succeeded", False),
    (204, "succeeded", "succeeded", False),
    (299, "succeeded", "succeeded", False),
    (410, "disabled", "failed", True),
    (400, "failed", "failed", False),
    (404, "failed", "failed", False),
    (302, "failed", "failed", False),
    (429, "retrying", "pending", False),
    (500, "retrying", "pending", False),
    (599, "retrying", "pending", False),
    (None, "retrying", "pending", False),
])
def test_what_each_answer_means(db: Db, alice: str, status: int | None, result: str, state: str,
                                disabled: bool) -> None:
    e, _ = _one_due(db)
    other = enqueue(db, "alice")  # a second delivery, waiting
    (row,) = [r for r in claim(db.conn, now=T0) if True]
    assert record(db.conn, row, status, now=T0) == result
    assert db.one("SELECT state FROM sftq.webhook_deliveries WHERE id = %s", row[0]) == state
    assert (_endpoint_state(db, e)[0] is not None) is disabled
    waiting = db.one("SELECT state FROM sftq.webhook_deliveries WHERE job_id = %s", other)
    assert waiting == ("failed" if disabled else "pending")
    if disabled:
        assert "410" in _endpoint_state(db, e)[1]


def test_a_test_delivery_is_never_retried(db: Db, alice: str) -> None:
    e = endpoint(db, "alice", ["job.succeeded"])
    db.conn.execute("SELECT sftq.webhook_send_test(%s, %s)", (uid(db, "alice"), e))
    (row,) = claim(db.conn)
    assert row[4] == "webhook.test"
    assert record(db.conn, row, 503) == "failed"
    assert _endpoint_state(db, e)[0] is None  # and a failed test does not disable anything
    db.conn.execute("SELECT sftq._webhook_disable(%s, 'gone', now())", (e,))
    with pytest.raises(psycopg.Error) as err:
        db.conn.execute("SELECT sftq.webhook_send_test(%s, %s)", (uid(db, "alice"), e))
    assert err.value.sqlstate == "SQ441"


def test_a_deleted_endpoints_deliveries_are_dropped_then_pruned(db: Db, alice: str) -> None:
    e = endpoint(db, "alice", ["job.queued"])
    enqueue(db, "alice")
    db.conn.execute("SELECT sftq.webhook_delete(%s, %s)", (uid(db, "alice"), e))
    assert db.one("SELECT webhook_count FROM sftq.users WHERE name = 'alice'") == 0
    assert claim(db.conn) == []
    assert db.one("SELECT state FROM sftq.webhook_deliveries") == "failed"
    assert db.one("SELECT sftq.webhook_prune(now() + interval '1 day')") == 1
    assert db.one("SELECT count(*) FROM sftq.webhook_deliveries") == 0


def test_deliveries_listing_is_newest_first(db: Db, alice: str) -> None:
    e = endpoint(db, "alice", ["job.queued"])
    enqueue(db, "alice")
    (row,) = claim(db.conn)
    record(db.conn, row, 503, error="HTTP 503")
    enqueue(db, "alice")
    items = json.loads(db.one("SELECT sftq.webhook_deliveries_json(%s, 10)::text", e))
    assert [(i["attempt"], i["outcome"]) for i in items] == [(0, "pending"), (1, "retrying")]
    assert items[1]["status_code"] == 503 and items[1]["next_retry_at"] is not None
    assert len(json.loads(db.one("SELECT sftq.webhook_deliveries_json(%s, 1)::text", e))) == 1
