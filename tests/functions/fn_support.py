"""Helpers for tests/functions: SQL setup of users and job lifecycles, a keyed test client,
a fake provider, and the error-envelope check."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from werkzeug.test import Client, TestResponse

SFT_PAYLOAD: dict[str, Any] = {
    "baseModel": "accounts/fireworks/models/qwen3-14b",
    "dataset": "accounts/trilogy/datasets/edullm-ela-sft-v3-thinking",
    "outputModel": "accounts/trilogy/models/out-v1",
    "epochs": 3,
    "learningRate": 0.0002,
    "wandbConfig": {"apiKey": "wandb-SECRET-0123456789"},
}


class FakeProvider:
    """Records stop calls; `fail` makes the next calls raise it (a provider outage)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail: Exception | None = None
        self.lock = threading.Lock()

    def stop_job(self, kind: str, job_id: str) -> str:
        with self.lock:
            self.calls.append((kind, job_id))
        if self.fail is not None:
            raise self.fail
        return "cancel" if kind == "RFT" else "delete"


@dataclass
class Db:
    """SQL helpers for test setup: users, keys and the scheduler's side of a job's life."""

    conn: psycopg.Connection[Any]
    keys: dict[str, str] = field(default_factory=dict)

    def one(self, sql: str, *params: Any) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def user(self, name: str) -> str:
        """Create a user and return a fresh API key for them."""
        self.conn.execute("SELECT sftq.create_user(%s)", (name,))
        key = str(self.one("SELECT key FROM sftq.issue_key(%s)", name))
        self.keys[name] = key
        return key

    def admit(self, gpus: int = 100, *, after: float = 0) -> list[str]:
        """Admit what fits, as of `after` seconds from now."""
        rows = self.conn.execute(
            "SELECT job_id FROM sftq.admit(%s, now() + make_interval(secs => %s))",
            (gpus, after)).fetchall()
        return [str(r[0]) for r in rows]

    def submitted(self, job_id: str, kind: str = "SFT") -> str:
        collection = {"SFT": "supervisedFineTuningJobs", "DPO": "dpoJobs",
                      "RFT": "reinforcementFineTuningJobs"}[kind]
        name = f"accounts/a/{collection}/sftq-{UUID(job_id).hex}"
        self.conn.execute("SELECT sftq.record_submitted(%s, %s, 'JOB_STATE_RUNNING')",
                          (job_id, name))
        return name

    def provider_state(self, job_id: str, state: str, message: str | None = None, *,
                       after: float = 0) -> None:
        self.conn.execute(
            "SELECT sftq.record_provider_state(%s, %s, %s, now() + make_interval(secs => %s))",
            (job_id, state, message, after))

    def state(self, job_id: str) -> str:
        return str(self.one("SELECT state FROM sftq.jobs WHERE id = %s", job_id))


class Api:
    """A werkzeug test client with the caller's key and JSON helpers."""

    def __init__(self, client: Client, prefix: str = "") -> None:
        self.client = client
        self.prefix = prefix

    def request(self, method: str, path: str, *, key: str | None = None,
                headers: dict[str, str] | None = None, **kwargs: Any) -> TestResponse:
        all_headers = dict(headers or {})
        if key is not None:
            all_headers.setdefault("Authorization", f"Bearer {key}")
        return self.client.open(self.prefix + path, method=method, headers=all_headers, **kwargs)

    def get(self, path: str, key: str | None = None, **kwargs: Any) -> TestResponse:
        return self.request("GET", path, key=key, **kwargs)

    def delete(self, path: str, key: str | None = None, **kwargs: Any) -> TestResponse:
        return self.request("DELETE", path, key=key, **kwargs)

    def post(self, path: str, key: str | None = None, **kwargs: Any) -> TestResponse:
        return self.request("POST", path, key=key, **kwargs)

    def submit(self, key: str, kind: str = "SFT", *, headers: dict[str, str] | None = None,
               **fields: Any) -> TestResponse:
        body: dict[str, Any] = {"kind": kind, "fireworks_payload": dict(SFT_PAYLOAD), **fields}
        return self.post("/jobs", key, data=json.dumps(body), headers=headers,
                         content_type="application/json")

    def enqueue(self, key: str, kind: str = "SFT", **fields: Any) -> str:
        resp = self.submit(key, kind, **fields)
        assert resp.status_code == 201, resp.get_data(as_text=True)
        return str(resp.json["id"])  # type: ignore[index]


def assert_error(resp: TestResponse, status: int, code: str) -> dict[str, Any]:
    """The one error envelope: {"error": str, "code": str} plus optional "details"."""
    assert resp.status_code == status, (resp.status_code, resp.get_data(as_text=True))
    assert resp.content_type == "application/json"
    body = resp.json
    assert isinstance(body, dict)
    assert body["code"] == code, body
    assert isinstance(body["error"], str) and body["error"]
    assert set(body) <= {"error", "code", "details"}, body
    return body
