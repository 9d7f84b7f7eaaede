"""Pipelines (POST /jobs "after") and run limits in SQL: sql/procedures/200_pipelines.sql and
205_run_limits.sql, and the few lines of the state machine, the queue view and complete_cancel
that call them."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg
import pytest

from .conftest import COUNTER_DRIFT, Q, check_code, t
from .test_waiting import tick

TICK = "30 seconds"
GRACE = "300 seconds"


def key(q: Q, name: str) -> bytes:
    raw = str(q.one("SELECT key FROM sftq.issue_key(%s)", name))
    return hashlib.sha256(raw.encode()).digest()


def submit(q: Q, k: bytes, after: list[str] | None = None, *, kind: str = "SFT",
           gpus: int = 4, max_run: int | None = None) -> UUID:
    row = q.conn.execute(
        "SELECT job_id FROM sftq.api_submit_job(%s, %s, %s::jsonb, NULL, %s, NULL, NULL, NULL, %s, %s)",
        (k, kind, json.dumps({"dataset": "d"}), gpus, after, max_run)).fetchone()
    assert row is not None
    return UUID(str(row[0]))


def succeed(q: Q, job: UUID, at: datetime | None = None) -> None:
    q.submitted(job, at=at)
    assert q.provider_state(job, "JOB_STATE_COMPLETED", at=at) == "SUCCESS"


def heads_are_right(q: Q) -> None:
    """Every user's head is their earliest QUEUED job that waits for no dependency."""
    bad = q.all("""
        SELECT u.name FROM sftq.users u
         WHERE u.head_job_id IS DISTINCT FROM (
               SELECT j.id FROM sftq.jobs j
                WHERE j.user_id = u.id AND j.state = 'QUEUED' AND j.waiting_on IS NULL
                ORDER BY j.created_at, j.id LIMIT 1)""")
    assert bad == []
    assert q.all(COUNTER_DRIFT) == []


@pytest.fixture
def two(q: Q) -> dict[str, Any]:
    return {"alice": q.user("alice"), "bob": q.user("bob"),
            "ka": key(q, "alice"), "kb": key(q, "bob")}


def test_a_waiting_job_is_no_candidate_and_joins_by_created_at_when_met(q: Q, two: dict[str, Any]) -> None:
    sft = submit(q, two["ka"])
    dpo = submit(q, two["ka"], [str(sft)], kind="DPO")
    assert q.job(dpo)["after"] == [sft] and q.job(dpo)["waiting_on"] == sft
    assert q.admit(8) == [sft]
    # Alice's DPO waits; Bob's later job passes it.
    bob = q.enqueue(two["bob"])
    alice_later = q.enqueue(two["alice"])
    assert q.one("SELECT head_job_id FROM sftq.users WHERE id = %s", two["alice"]) == alice_later
    heads_are_right(q)
    assert q.admit(8) == [bob]
    # The SFT succeeds: in that same transaction the DPO becomes Alice's head again, ahead
    # of her later job (created after it), so the next walk admits it.
    succeed(q, sft)
    assert q.job(dpo)["waiting_on"] is None
    assert q.one("SELECT head_job_id FROM sftq.users WHERE id = %s", two["alice"]) == dpo
    heads_are_right(q)
    assert q.admit(8) == [dpo]
    assert [e[0] for e in q.events(dpo)] == ["queued", "waiting_for_dependency",
                                             "dependencies_met", "admitted"]


def test_a_met_dependency_is_simply_met_and_duplicates_count_once(q: Q, two: dict[str, Any]) -> None:
    sft = submit(q, two["ka"])
    q.admit(4)
    succeed(q, sft)
    dpo = submit(q, two["ka"], [str(sft), str(sft)[:8], str(sft).replace("-", "").upper()])
    job = q.job(dpo)
    assert job["after"] == [sft] and job["waiting_on"] is None
    assert q.admit(4) == [dpo]


def test_several_dependencies_wait_for_the_last(q: Q, two: dict[str, Any]) -> None:
    a, b = submit(q, two["ka"]), submit(q, two["ka"])
    c = submit(q, two["ka"], [str(a), str(b)])
    assert q.admit(8) == [a]
    succeed(q, a)
    assert q.job(c)["waiting_on"] == b
    assert q.admit(8) == [b]
    succeed(q, b)
    assert q.admit(8) == [c]


def test_a_failed_dependency_cancels_the_chain_in_its_own_transaction(q: Q, two: dict[str, Any]) -> None:
    a = submit(q, two["ka"])
    b = submit(q, two["ka"], [str(a)])
    c = submit(q, two["ka"], [str(b)])
    other = submit(q, two["ka"])
    q.admit(4)
    q.submitted(a)
    assert q.provider_state(a, "JOB_STATE_FAILED", "boom") == "FAIL"
    for job, dep in ((b, a), (c, b)):
        row = q.job(job)
        assert row["state"] == "CANCELLED"
        assert row["error"] == f"cancelled: job {dep}, which this job runs after, ended " + (
            "FAIL" if dep == a else "CANCELLED")
        detail = q.one("SELECT detail FROM sftq.job_events WHERE job_id = %s AND event = 'dependency_failed'", job)
        assert detail["after"] == str(dep) and detail["reason"] == "dependency_failed"
    assert q.state(other) == "QUEUED"
    heads_are_right(q)
    # A cancel of a queued dependency does the same.
    d = submit(q, two["ka"])
    e = submit(q, two["ka"], [str(d)])
    q.one("SELECT job_id FROM sftq.cancel(%s, %s)", two["alice"], d)
    assert q.state(e) == "CANCELLED"
    heads_are_right(q)


def test_refusals_unknown_other_users_too_many_ended_cycle(q: Q, two: dict[str, Any]) -> None:
    mine = submit(q, two["ka"])
    bobs = submit(q, two["kb"])
    unknown = "0123abcd-0000-4000-8000-000000000000"
    msgs = []
    for ref in (str(bobs), unknown):
        with pytest.raises(psycopg.Error) as exc:
            submit(q, two["ka"], [str(mine), ref])
        check_code(exc, "SQ460")
        msgs.append(exc.value.diag.message_primary)
    # Another user's id reads exactly like an id nobody has.
    assert msgs == [f"after: you have no job {bobs}", f"after: you have no job {unknown}"]
    with pytest.raises(psycopg.Error) as exc:
        submit(q, two["ka"], [str(mine)] * 21)
    check_code(exc, "SQ463")
    q.one("SELECT job_id FROM sftq.cancel(%s, %s)", two["alice"], mine)
    with pytest.raises(psycopg.Error) as exc:
        submit(q, two["ka"], [str(mine)])
    check_code(exc, "SQ462")
    # Nothing was enqueued by any refusal.
    assert q.one("SELECT count(*) FROM sftq.jobs WHERE user_id = %s", two["alice"]) == 1
    # A cycle cannot be made through the API (a job names only older jobs); an edge made by
    # hand is still refused.
    x = submit(q, two["ka"])
    y = submit(q, two["ka"], [str(x)])
    q.conn.execute("INSERT INTO sftq.job_dependencies (job_id, after_id) VALUES (%s, %s)", (x, y))
    assert q.one("SELECT sftq._after_cycle(%s, %s::uuid[])", x, [y]) is True
    with pytest.raises(psycopg.Error) as exc:
        q.one("SELECT sftq._pipeline_hold(%s, %s::uuid[], NULL)", x, [y])
    check_code(exc, "SQ461")


def test_the_waiting_reason_names_the_dependency(q: Q, two: dict[str, Any]) -> None:
    sft = submit(q, two["ka"])
    dpo = submit(q, two["ka"], [str(sft)])
    later = submit(q, two["ka"])
    tick(q, datetime.now(UTC))
    rows = {UUID(str(r[0])): r for r in q.all(
        "SELECT id, waiting_code, waiting_message, estimated_start_at FROM sftq.queue_view(%s, now(), %s, %s)",
        two["alice"], TICK, GRACE)}
    assert rows[dpo][1] == "waiting_for_dependency"
    assert str(sft) in rows[dpo][2] and "(QUEUED)" in rows[dpo][2]
    assert rows[dpo][3] is None
    # The job behind the waiting one is behind the SFT only (one own job ahead, not two).
    assert rows[later][1] == "behind_own_queued_job"
    assert "Behind 1 of your own" in rows[later][2]
    # The operators' preview says the same.
    preview = {UUID(str(r[0])): r[1:] for r in q.all(
        "SELECT job_id, decision, reason, code FROM sftq.preview_admission(16)")}
    assert preview[dpo] == ("wait", f"waits for job {sft} (after)", "waiting_for_dependency")
    assert preview[sft][0] == "admit" and preview[later][2] == "behind_own_queued_job"
    # GET /queue: the owner reads the reason; everyone else a sentence naming no job.
    items = q.one("SELECT sftq.public_queue(%s, 10, now(), %s, %s)",
                  two["bob"], TICK, GRACE)["items"]
    theirs = [i for i in items if i["waiting_reason"]["code"] == "waiting_for_dependency"]
    assert len(theirs) == 1 and str(sft) not in json.dumps(theirs)
    mine = q.one("SELECT sftq.public_queue(%s, 10, now(), %s, %s)",
                 two["alice"], TICK, GRACE)["items"]
    assert [i["waiting_reason"]["code"] for i in mine] == [
        "next_tick", "waiting_for_dependency", "behind_own_queued_job"]


def test_run_timeout_records_a_cancel_and_completes_with_its_reason(q: Q, two: dict[str, Any]) -> None:
    own = submit(q, two["ka"], max_run=600)
    dflt = submit(q, two["kb"], kind="RFT")
    q.admit(8, at=t(0))
    q.submitted(own, at=t(0))
    q.submitted(dflt, at=t(0))
    assert q.all("SELECT * FROM sftq.run_limits(NULL, NULL, %s)", t(599)) == []
    rows = q.all("SELECT job_id, kind, action FROM sftq.run_limits(3600, NULL, %s)", t(601))
    assert [(UUID(str(r[0])), r[2]) for r in rows] == [(own, "run_timeout")]
    # Recorded once.
    assert q.all("SELECT * FROM sftq.run_limits(3600, NULL, %s)", t(700)) == []
    assert q.job(own)["cancel_reason"] == "run_timeout"
    assert q.one("SELECT sftq.complete_cancel(%s, 'scheduler', '{}'::jsonb, %s)", own, t(602)) == "CANCELLED"
    row = q.job(own)
    assert row["error"] == "stopped: it ran at Fireworks for 601 s, past its max_run_seconds (600 s)"
    assert q.events(own)[-1] == ("run_timeout", "PROGRESS", "CANCELLED")
    rows = q.all("SELECT job_id, action FROM sftq.run_limits(3600, NULL, %s)", t(3600))
    assert [(UUID(str(r[0])), r[1]) for r in rows] == [(dflt, "run_timeout")]
    # A user's cancel still ends as before.
    job = submit(q, two["ka"])
    q.admit(8, at=t(4000))
    q.submitted(job, at=t(4000))
    q.one("SELECT action FROM sftq.cancel(%s, %s)", two["alice"], job)
    q.one("SELECT sftq.complete_cancel(%s)", job)
    assert q.job(job)["error"] is None and q.events(job)[-1][0] == "cancelled"


def test_a_stalled_job_gets_one_event_and_is_not_cancelled(q: Q, two: dict[str, Any]) -> None:
    job = submit(q, two["ka"])
    q.admit(4, at=t(0))
    q.submitted(job, at=t(0))
    obs = "SELECT sftq.observe_provider_job(%s, %s::jsonb, %s)"
    q.one(obs, job, json.dumps({"state": "JOB_STATE_RUNNING", "percent": 10}), t(100))
    q.one(obs, job, json.dumps({"state": "JOB_STATE_RUNNING", "percent": 10}), t(5000))
    assert q.all("SELECT * FROM sftq.run_limits(NULL, 7200, %s)", t(7299)) == []
    rows = q.all("SELECT action FROM sftq.run_limits(NULL, 7200, %s)", t(7300))
    assert rows == [("stalled",)]
    assert q.all("SELECT * FROM sftq.run_limits(NULL, 7200, %s)", t(20000)) == []
    assert [e[0] for e in q.events(job)].count("stalled") == 1
    assert q.state(job) == "PROGRESS"
    j = json.loads(json.dumps(q.one("SELECT sftq.job_json(j) FROM sftq.jobs j WHERE id = %s", job)))
    assert j["stalled"] is True and j["stalled_since"].startswith("2026-05-01T10:01:40")
    assert q.one("SELECT (sftq.metrics() ->> 'stalled_jobs')::int") == 1
    # Progress moves: no longer stalled (and no second event ever).
    q.one(obs, job, json.dumps({"state": "JOB_STATE_RUNNING", "percent": 20}), t(20001))
    j = q.one("SELECT sftq.job_json(j) FROM sftq.jobs j WHERE id = %s", job)
    assert j["stalled"] is False and j["stalled_since"] is None
    assert q.one("SELECT (sftq.metrics() ->> 'stalled_jobs')::int") == 0
    assert q.all("SELECT * FROM sftq.run_limits(NULL, 7200, %s)", t(40000)) == []
