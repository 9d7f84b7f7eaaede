"""GET /jobs: case-insensitive state and kind, and id_prefix (how a short id becomes a full
one): only the caller's jobs, a range scan of the primary key, never a whole history."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from fn_support import Api, Db, assert_error


def set_job_id(db: Db, old: str, new: str) -> None:
    """Give a job a chosen id (test setup only), so that two ids can share a prefix."""
    db.conn.execute("SET session_replication_role = replica")  # no FK checks or triggers
    try:
        db.conn.execute("UPDATE sftq.jobs SET id = %s WHERE id = %s", (new, old))
        db.conn.execute("UPDATE sftq.job_events SET job_id = %s WHERE job_id = %s", (new, old))
        db.conn.execute("UPDATE sftq.users SET head_job_id = %s WHERE head_job_id = %s",
                        (new, old))
    finally:
        db.conn.execute("SET session_replication_role = DEFAULT")


def ids(resp: Any) -> list[str]:
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return [j["id"] for j in resp.json]


def test_state_and_kind_are_case_insensitive(api: Api, db: Db, alice: str) -> None:
    sft = api.enqueue(alice, "SFT")
    dpo = api.enqueue(alice, "DPO")
    assert ids(api.get("/jobs?state=queued", alice)) == [dpo, sft]
    assert ids(api.get("/jobs?kind=dpo", alice)) == [dpo]
    assert ids(api.get("/jobs?state=Queued&kind=Sft", alice)) == [sft]
    assert ids(api.get("/jobs?state=progress", alice)) == []
    for bad in ("?state=done", "?kind=ppo", "?state=", "?kind="):
        assert_error(api.get("/jobs" + bad, alice), 400, "validation_error")


def test_id_prefix_finds_only_the_callers_jobs(api: Api, db: Db, alice: str, bob: str) -> None:
    mine = [api.enqueue(alice) for _ in range(3)]
    theirs = api.enqueue(bob)
    set_job_id(db, mine[0], "0f6c1c9e-1a2b-4c3d-8e4f-000000000001")
    set_job_id(db, mine[1], "0f6c1c9e-1a2b-4c3d-8e4f-000000000002")
    set_job_id(db, theirs, "0f6c1c9e-1a2b-4c3d-8e4f-000000000003")

    both = ["0f6c1c9e-1a2b-4c3d-8e4f-000000000002", "0f6c1c9e-1a2b-4c3d-8e4f-000000000001"]
    assert ids(api.get("/jobs?id_prefix=0f6c1c9e", alice)) == both  # newest first
    assert ids(api.get("/jobs?id_prefix=0F6C1C9E-1A2B", alice)) == both
    assert ids(api.get("/jobs?id_prefix=0f6c1c9e&limit=1", alice)) == both[1:]
    assert ids(api.get("/jobs?id_prefix=0f6c1c9e1a2b4c3d8e4f000000000001", alice)) == both[1:]
    assert ids(api.get(f"/jobs?id_prefix={mine[2][:8]}", alice)) == [mine[2]]
    assert ids(api.get("/jobs?id_prefix=0f6c1c9e&state=progress", alice)) == []
    # Bob's job shares the prefix; for alice it does not exist (and for bob, only his).
    assert ids(api.get("/jobs?id_prefix=0f6c1c9e-1a2b-4c3d-8e4f-000000000003", alice)) == []
    assert ids(api.get("/jobs?id_prefix=0f6c1c9e", bob)) == ["0f6c1c9e-1a2b-4c3d-8e4f-000000000003"]
    # One page, never paged: no cursor headers, and a cursor is refused.
    resp = api.get("/jobs?id_prefix=0f6c1c9e&limit=1", alice)
    assert "X-Next-Cursor" not in resp.headers and "Link" not in resp.headers


@pytest.mark.parametrize("query", [
    "?id_prefix=", "?id_prefix=0f6c1c9", "?id_prefix=0f6c-1c9", "?id_prefix=xyzxyzxy",
    "?id_prefix=" + "0" * 33, "?id_prefix=0f6c1c9e&cursor=1_" + "0" * 32,
    "?id_prefix=0f6c1c9e&id_prefix=0f6c1c9f", "?id_prefix=0f6c1c9e&limit=0",
])
def test_bad_id_prefixes_are_400(api: Api, alice: str, query: str) -> None:
    assert_error(api.get("/jobs" + query, alice), 400, "validation_error")


def test_the_lookup_is_a_range_scan_of_the_primary_key(db: Db, db_url: str, alice: str) -> None:
    # A user with a long history: the lookup reads the id range, not alice's jobs one by one.
    db.conn.execute(
        "SELECT sftq.enqueue(u.id, 'SFT', '{\"dataset\": \"d\"}'::jsonb) "
        "FROM sftq.users u, generate_series(1, 3000) WHERE u.name = 'alice'"
    )
    db.conn.execute("ANALYZE sftq.jobs")
    key_hash = db.one("SELECT key_hash FROM sftq.api_keys k JOIN sftq.users u "
                      "ON u.id = k.user_id WHERE u.name = 'alice'")
    plans: list[str] = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for setting, value in (("auto_explain.log_min_duration", "0"),
                               ("auto_explain.log_nested_statements", "on"),
                               ("auto_explain.log_level", "notice"),
                               ("client_min_messages", "notice")):
            conn.execute(f"SET {setting} = {value}")
        for mode in ("force_custom_plan", "force_generic_plan"):
            conn.execute(f"SET plan_cache_mode = {mode}")
            plans.clear()
            conn.execute("SELECT sftq.api_jobs_by_id_prefix(%s, %s, NULL, NULL, 10)",
                         (key_hash, "0f6c1c9e"))
            nested = [p for p in plans if "sftq.jobs" in p or "jobs j" in p or "jobs_" in p]
            assert any("jobs_pkey" in p for p in nested), (mode, plans)
            assert not any("jobs_user_created_idx" in p for p in nested), (mode, plans)
