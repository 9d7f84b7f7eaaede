"""A live `sftq dev` for the dashboard's browser tests: tests/e2e's DevStacks (the stack as a
tracked subprocess), and what the tests do to it (ticks, submissions, /_sim, users)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]


def e2e_helpers() -> ModuleType:
    """tests/e2e/conftest.py's helpers (DevStacks: `sftq dev` as a tracked subprocess)."""
    name = "sftq_e2e_helpers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "e2e" / "conftest.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]



def minimal_payload(kind: str) -> dict[str, Any]:
    """A small body of the kind's own shape: the simulator refuses another kind's fields (an
    SFT body's top-level baseModel on a DPO job), as Fireworks does."""
    model = "accounts/fireworks/models/qwen3-14b"
    dataset = "accounts/demo/datasets/dash"
    if kind.upper() == "SFT":
        return {"baseModel": model, "dataset": dataset}
    if kind.upper() == "DPO":
        return {"dataset": dataset, "trainingConfig": {"baseModel": model}}
    return {"dataset": dataset, "evaluator": "accounts/demo/evaluators/dash",
            "trainingConfig": {"baseModel": model},
            "inferenceParameters": {"responseCandidatesCount": 4}}

class Stack:
    """A live `sftq dev` (ticks fired by the test, simulated jobs finished through /_sim)."""

    def __init__(self, values: dict[str, str], http: httpx.Client) -> None:
        self.values = values
        self.http = http
        self.base = values["SUPABASE_URL"]
        self.api = f"{self.base}/functions/v1/jobs-api"
        self.url = values["DASHBOARD_URL"]
        self.key = values["SFTQ_API_KEY"]
        self.database_url = values["DATABASE_URL"]

    def auth(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def tick(self) -> dict[str, Any]:
        r = self.http.post(f"{self.base}/functions/v1/scheduler-tick",
                           headers={"Authorization": f"Bearer {self.values['SFTQ_TICK_SECRET']}"})
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def submit(self, name: str | None, key: str | None = None, gpus: int = 4,
               payload: dict[str, Any] | None = None, kind: str = "SFT") -> str:
        r = self.http.post(f"{self.api}/jobs", headers=self.auth(key), json={
            "kind": kind, "display_name": name, "gpu_count": gpus,
            "fireworks_payload": payload or minimal_payload(kind)})
        assert r.status_code == 201, r.text
        job_id: str = r.json()["id"]
        return job_id

    def job(self, job_id: str, key: str | None = None) -> dict[str, Any]:
        r = self.http.get(f"{self.api}/jobs/{job_id}", headers=self.auth(key))
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def finish(self, job_id: str, state: str = "JOB_STATE_COMPLETED",
               key: str | None = None) -> None:
        name = str(self.job(job_id, key)["fireworks_job_name"])
        _, _, collection, fw_id = name.split("/")
        r = self.http.post(f"{self.values['SIMULATOR_URL']}/_sim/jobs/{collection}/{fw_id}:finish",
                           json={"state": state})
        assert r.status_code == 200, r.text

    def user(self, name: str) -> str:
        """A user and a fresh key for them."""
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM sftq.users WHERE name = %s", (name,)).fetchone():
                conn.execute("SELECT sftq.create_user(%s)", (name,))
            row = conn.execute("SELECT key FROM sftq.issue_key(%s)", (name,)).fetchone()
        assert row is not None
        return str(row[0])

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def seed_history(self, user: str, days: int = 7) -> None:
        """A week of history through the procedures, with past clocks: finished jobs of `user`
        (waits and run times that vary) and ticks that read the quota every 15 minutes."""
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            _seed_jobs(conn, user, days)
            _seed_ticks(conn, days)


_ENQUEUE = "SELECT id FROM sftq.enqueue(%s, %s, %s::jsonb, %s, 4, NULL, %s)"
_SUBMITTED = "SELECT sftq.record_submitted(%s, %s, 'JOB_STATE_RUNNING', false, %s)"
_ENDED = "SELECT sftq.record_provider_state(%s, %s, NULL, %s)"


def _seed_jobs(conn: Any, user: str, days: int) -> None:
    import math
    from datetime import UTC, datetime, timedelta

    uid = conn.execute("SELECT id FROM sftq.users WHERE name = %s", (user,)).fetchone()[0]
    at = datetime.now(UTC) - timedelta(days=days)
    for i in range(days * 5):
        kind = ("SFT", "SFT", "DPO", "RFT")[i % 4]
        wait = timedelta(minutes=2 + 20 * (1 + math.sin(i / 3)))
        run = timedelta(minutes=30 + 25 * (1 + math.cos(i / 4)) + (30 if kind == "RFT" else 0))
        job = conn.execute(_ENQUEUE, (uid, kind, '{"dataset": "d"}', f"history {i}", at))
        job_id = job.fetchone()[0]
        conn.execute("SELECT * FROM sftq.admit(64, %s)", (at + wait,))
        name = f"accounts/sim-account/supervisedFineTuningJobs/h{job_id.hex}"
        conn.execute(_SUBMITTED, (job_id, name, at + wait))
        ended = "JOB_STATE_FAILED" if i % 9 == 4 else "JOB_STATE_COMPLETED"
        conn.execute(_ENDED, (job_id, ended, at + wait + run))
        at += timedelta(hours=24 / 5)


def _seed_ticks(conn: Any, days: int) -> None:
    import json
    import math
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    t = now - timedelta(days=days)
    while t < now - timedelta(minutes=5):
        ours = 4 * round(2 + 2 * math.sin((t.hour + t.minute / 60) / 24 * 2 * math.pi))
        tick = conn.execute("SELECT sftq.tick_begin('history', interval '1 minute', %s)", (t,))
        result = {"quota_limit": 64, "quota_usage": ours + 8, "ours_total": ours, "admitted": 0}
        conn.execute("SELECT sftq.tick_finish(%s, %s::jsonb, %s)",
                     (tick.fetchone()[0], json.dumps(result), t + timedelta(seconds=1)))
        t += timedelta(minutes=15)
