"""The analyst role reads the views, and nothing else: no key table, no raw payloads."""

from __future__ import annotations

import json
from datetime import timedelta

import psycopg
import pytest

from .conftest import T0, Q


def test_analyst_reads_redacted_views_only(q: Q) -> None:
    a = q.user("a")
    q.all("SELECT * FROM sftq.issue_key('a')")
    payload = {
        "dataset": "d",
        "wandbConfig": {"enabled": True, "apiKey": "wandb-SECRET"},
        "awsS3Config": {"credentialsSecret": "aws-SECRET"},
        "nested": [{"authToken": "tok-SECRET", "dbPassword": "pw-SECRET", "epochs": 3}],
    }
    job = q.enqueue(a, payload=payload)
    q.admit(8)
    q.conn.execute("SET ROLE sftq_analyst")
    try:
        shown = q.one("SELECT fireworks_payload FROM sftq.analyst_jobs WHERE id = %s", job)
        assert "SECRET" not in json.dumps(shown)
        assert shown["wandbConfig"] == {"enabled": True, "apiKey": "[REDACTED]"}
        assert shown["nested"][0]["epochs"] == 3
        for view in (
            "analyst_jobs",
            "analyst_job_events",
            "analyst_ticks",
            "analyst_users",
            "analyst_queue",
            "analyst_daily",
        ):
            q.all(f"SELECT * FROM sftq.{view}")
        assert q.one("SELECT count(*) FROM sftq.analyst_job_events WHERE event = 'admitted'") == 1
        for forbidden in (
            "SELECT * FROM sftq.api_keys",
            "SELECT fireworks_payload FROM sftq.jobs",
            "SELECT * FROM sftq.users",
            "SELECT * FROM sftq.job_events",
            "SELECT * FROM sftq_migrations.applied",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                q.conn.execute(forbidden)
        # Nor can it call the procedures that change state.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            q.conn.execute("SELECT * FROM sftq.admit(100)")
    finally:
        q.conn.execute("RESET ROLE")


def test_analyst_reads_the_rolled_up_views_in_any_time_zone_and_not_the_rollup(q: Q) -> None:
    a = q.user("a")
    day = T0.replace(hour=0, minute=0, second=0, microsecond=0)
    q.enqueue(a, "SFT", 4, at=day - timedelta(hours=1))
    q.enqueue(a, "DPO", 2, at=day - timedelta(minutes=10))
    # The first tick of a day moves the rollup's horizon on, the next one rolls the day up.
    for at in (day + timedelta(minutes=1), day + timedelta(minutes=2)):
        tick = q.one("SELECT sftq.tick_begin('t', interval '2 minutes', %s)", at)
        q.one("SELECT sftq.tick_finish(%s, '{}'::jsonb, %s)::text", tick, at)
    assert q.one("SELECT count(*) FROM sftq.daily_rollup") == 2
    q.admit(8, day + timedelta(minutes=3))  # a move not folded in yet
    q.conn.execute("SET ROLE sftq_analyst")
    try:
        for zone in ("UTC", "Asia/Kolkata", "America/New_York"):
            q.conn.execute(f"SET TIME ZONE '{zone}'")
            rows = q.all("SELECT kind, state, jobs FROM sftq.analyst_daily ORDER BY kind")
            assert rows == [("DPO", "QUEUED", 1), ("SFT", "PROGRESS", 1)], zone
        assert q.one("SELECT count(*) FROM sftq.analyst_queue WHERE fifo_rank <= 10") == 1
        for forbidden in (
            "SELECT * FROM sftq.daily_rollup",
            "SELECT * FROM sftq.daily_rollup_hours",
            "SELECT * FROM sftq.daily_rollup_moves",
            "SELECT * FROM sftq.daily_rollup_state",
            "SELECT sftq.daily_rollup_refresh()",
            "SELECT sftq.daily_rollup_rebuild()",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                q.conn.execute(forbidden)
    finally:
        q.conn.execute("RESET ROLE")
        q.conn.execute("SET TIME ZONE 'UTC'")


def test_api_role_can_only_execute_the_api_entry_points(q: Q) -> None:
    q.user("a")
    key = q.one("SELECT key FROM sftq.issue_key('a')")
    q.conn.execute("SET ROLE sftq_api")
    try:
        body = q.one(
            "SELECT sftq.api_enqueue(sha256(convert_to(%s, 'UTF8')), 'SFT', '{}'::jsonb, NULL, 4, NULL)",
            key,
        )
        assert body is not None
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            q.conn.execute("SELECT * FROM sftq.jobs")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            q.conn.execute("SELECT * FROM sftq.admit(100)")
    finally:
        q.conn.execute("RESET ROLE")


def test_scheduler_role_runs_a_whole_cycle_but_cannot_read_keys(q: Q) -> None:
    a = q.user("a")
    q.all("SELECT * FROM sftq.issue_key('a')")
    job = q.enqueue(a)
    q.conn.execute("SET ROLE sftq_scheduler")
    try:
        tick = q.one("SELECT sftq.tick_begin('t')")
        assert q.one("SELECT sftq.admit_for_quota(16, 0)")["jobs"][0]["job_id"] == str(job)
        q.all("SELECT * FROM sftq.scheduler_work()")
        assert (
            q.one(
                "SELECT sftq.record_submitted(%s, 'accounts/x/dpoJobs/y', 'JOB_STATE_RUNNING')", job
            )
            == "ok"
        )
        assert (
            q.one("SELECT sftq.record_provider_state(%s, 'JOB_STATE_COMPLETED', NULL)", job)
            == "SUCCESS"
        )
        q.one("SELECT sftq.tick_finish(%s, '{}'::jsonb)::text", tick)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            q.conn.execute("SELECT key_hash FROM sftq.api_keys")
    finally:
        q.conn.execute("RESET ROLE")


SECRET_KEYS = ("apiKey", "api_key", "API-KEY", "credentialsSecret", "clientSecret", "password",
               "dbPassword", "passphrase", "credentials", "token", "accessToken", "hf_token",
               "authToken", "refresh_token", "privateKey", "accessKeyId", "Authorization",
               "auth", "bearer")
PLAIN_KEYS = ("maxOutputTokens", "maxTokens", "max_tokens", "tokenizer", "tokenLimit",
              "maxContextLength", "numTokens", "epochs", "keyword", "dataset", "author")


def test_redaction_hides_secret_names_and_shows_token_counts(q: Q) -> None:
    """The rule is precise: secrets hidden at any depth, counts of tokens shown as sent."""
    payload = {
        "inferenceParameters": {"maxOutputTokens": 1024, "temperature": 0.7},
        "wandbConfig": {"enabled": True, "apiKey": "wandb-SECRET", "project": "p"},
        "awsS3Config": {"credentialsSecret": "aws-SECRET", "iamRoleArn": "arn:x"},
        "deep": [{k: f"{k}-SECRET" for k in SECRET_KEYS} | {k: 7 for k in PLAIN_KEYS}],
    }
    shown = q.one("SELECT sftq.redact_secrets(%s::jsonb)", json.dumps(payload))
    assert "SECRET" not in json.dumps(shown)
    assert shown["inferenceParameters"] == {"maxOutputTokens": 1024, "temperature": 0.7}
    assert shown["wandbConfig"] == {"enabled": True, "apiKey": "[REDACTED]", "project": "p"}
    assert shown["awsS3Config"] == {"credentialsSecret": "[REDACTED]", "iamRoleArn": "arn:x"}
    for key in SECRET_KEYS:
        assert shown["deep"][0][key] == "[REDACTED]", key
    for key in PLAIN_KEYS:
        assert shown["deep"][0][key] == 7, key
    # The analyst's view applies the same rule.
    a = q.user("a")
    job = q.enqueue(a, payload=payload)
    q.conn.execute("SET ROLE sftq_analyst")
    try:
        seen = q.one("SELECT fireworks_payload FROM sftq.analyst_jobs WHERE id = %s", job)
    finally:
        q.conn.execute("RESET ROLE")
    assert seen == shown
