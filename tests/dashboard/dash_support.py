"""Helpers for tests/dashboard: SQL setup through the procedures (users, keys, jobs, ticks) and a
keyed WSGI test client for jobs-api."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from werkzeug.test import Client, TestResponse

T0 = datetime(2026, 5, 1, 10, 0, 0, tzinfo=UTC)
TICK = timedelta(seconds=30)
GRACE = timedelta(minutes=5)

PAYLOAD: dict[str, Any] = {
    "baseModel": "accounts/fireworks/models/qwen3-14b",
    "dataset": "accounts/demo/datasets/dash",
    "epochs": 2,
    "wandbConfig": {"apiKey": "wandb-SECRET-0123456789", "project": "dash"},
    "awsS3Config": {"credentialsSecret": "aws-SECRET-abcdef"},
}
SECRETS = ("wandb-SECRET-0123456789", "aws-SECRET-abcdef")


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Q:
    """Small helpers over one autocommit connection, each a call of one procedure."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def one(self, sql: str, *params: Any) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def all(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()

    def user(self, name: str, cap: int = 1) -> int:
        return int(self.one("SELECT sftq.create_user(%s, %s)", name, cap))

    def key(self, name: str) -> str:
        return str(self.one("SELECT key FROM sftq.issue_key(%s)", name))

    def enqueue(self, user: int, kind: str = "SFT", gpus: int = 4, *,
                name: str | None = None, payload: dict[str, Any] | None = None,
                at: datetime | None = None) -> UUID:
        row = self.conn.execute(
            "SELECT id FROM sftq.enqueue(%s, %s, %s::jsonb, %s, %s, NULL, %s)",
            (user, kind, json.dumps(payload or {"dataset": "d"}), name, gpus, at),
        ).fetchone()
        assert row is not None
        return UUID(str(row[0]))

    def admit(self, gpus: int, at: datetime) -> list[UUID]:
        rows = self.all("SELECT job_id FROM sftq.admit(%s, %s)", gpus, at)
        return [UUID(str(r[0])) for r in rows]

    def submitted(self, job: UUID, at: datetime) -> None:
        self.one("SELECT sftq.record_submitted(%s, %s, 'JOB_STATE_RUNNING', false, %s)",
                 job, f"accounts/a/supervisedFineTuningJobs/sftq-{job.hex}", at)

    def finish(self, job: UUID, state: str, at: datetime) -> None:
        """The provider reports the job ended (JOB_STATE_COMPLETED / JOB_STATE_FAILED)."""
        self.one("SELECT sftq.record_provider_state(%s, %s, NULL, %s)", job, state, at)

    def cancel(self, user: int, job: UUID) -> None:
        self.all("SELECT * FROM sftq.cancel(%s, %s)", user, job)

    def tick(self, at: datetime, limit: int | None = 16, usage: float = 0,
             ours: int | None = None) -> None:
        """A finished scheduler tick at `at` that read the quota (or could not: limit None)."""
        tick_id = self.one("SELECT sftq.tick_begin('test', interval '2 minutes', %s)", at)
        result: dict[str, Any] = {"admitted": 0}
        if limit is not None:
            result |= {"quota_limit": limit, "quota_usage": usage}
        if ours is not None:
            result["ours_total"] = ours
        self.one("SELECT sftq.tick_finish(%s, %s::jsonb, %s)", tick_id, json.dumps(result), at)


class Api:
    """A werkzeug test client that sends one user's key."""

    def __init__(self, client: Client, key: str | None = None) -> None:
        self.client = client
        self.key = key

    def headers(self, key: str | None = None) -> dict[str, str]:
        k = key or self.key
        return {"Authorization": f"Bearer {k}"} if k else {}

    def get(self, path: str, key: str | None = None, **kw: Any) -> TestResponse:
        headers = self.headers(key) | kw.pop("headers", {})
        return self.client.get(path, headers=headers, **kw)

    def post(self, path: str, body: Any, key: str | None = None) -> TestResponse:
        return self.client.post(path, headers=self.headers(key), json=body)


def envelope(resp: TestResponse, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, (resp.status_code, resp.get_data(as_text=True))
    body: dict[str, Any] = resp.get_json()
    assert body["code"] == code, body
    assert isinstance(body["error"], str) and body["error"]
    return body
