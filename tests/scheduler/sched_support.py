"""Helpers for the scheduler tests: a simulator that also records what each create answered,
and short ways to make users and jobs through the procedures."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl

import psycopg

from sftq_server.simulator import COLLECTIONS, Simulator

ACCOUNT = "sim-account"
# Long and distinctive, so a leak anywhere is found by a plain substring search.
API_KEY = "fw-SCHED-secret-key-5f1c0ffee0ddba11"
TICK_SECRET = "tick-secret-0123456789abcdefghij"

KIND_COLLECTION = {kind: coll for coll, (kind, _) in COLLECTIONS.items()}


def payload(kind: str, *, valid: bool = True) -> dict[str, Any]:
    """A Fireworks body the simulator accepts (or rejects with a 400 when valid=False)."""
    if kind == "SFT":
        body: dict[str, Any] = {"dataset": "accounts/a/datasets/d", "baseModel": "m",
                                "wandbConfig": {"enabled": True, "apiKey": "wandb-SECRET"}}
    elif kind == "DPO":
        body = {"dataset": "accounts/a/datasets/d", "trainingConfig": {"baseModel": "m"}}
    else:
        body = {"dataset": "accounts/a/datasets/d", "evaluator": "accounts/a/evaluators/e",
                "inferenceParameters": {"responseCandidatesCount": 4}}
    if not valid:
        if kind == "RFT":
            body["inferenceParameters"] = {"responseCandidatesCount": 1}
        else:
            del body["dataset"]
    return body


def pid(job_id: uuid.UUID | str) -> str:
    return "sftq-" + uuid.UUID(str(job_id)).hex


class RecordingSimulator(Simulator):
    """The simulator, plus what every create answered: [(collection, id, status, body)].

    The simulator's own request log records requests, not answers; "created exactly once"
    needs the answers (a 409 or an injected 503 is a create that did not create).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.creates: list[tuple[str, str, int, str]] = []
        self._creates_lock = threading.Lock()

    def __call__(self, environ: Any, start_response: Any) -> Any:
        method = str(environ.get("REQUEST_METHOD", ""))
        path = str(environ.get("PATH_INFO", ""))
        collection = path.rstrip("/").rsplit("/", 1)[-1]
        if method != "POST" or collection not in COLLECTIONS:
            return super().__call__(environ, start_response)
        query = dict(parse_qsl(str(environ.get("QUERY_STRING", ""))))
        job_id = query.get(COLLECTIONS[collection][1], "")
        seen: dict[str, int] = {}

        def capture(status: str, headers: Any, exc_info: Any = None) -> Any:
            seen["status"] = int(status.split()[0])
            return start_response(status, headers, exc_info)

        body = b"".join(super().__call__(environ, capture))
        with self._creates_lock:
            self.creates.append((collection, job_id, seen["status"], body.decode()))
        return [body]

    def created_ok(self) -> Counter[str]:
        """Per provider id, how many creates answered 200 (made a job)."""
        with self._creates_lock:
            return Counter(job_id for _, job_id, status, _ in self.creates if status == 200)

    def create_answers(self, job_id: str) -> list[tuple[int, str]]:
        with self._creates_lock:
            return [(status, body) for _, jid, status, body in self.creates if jid == job_id]

    def sim_jobs(self) -> dict[str, dict[str, Any]]:
        """The simulator's jobs (deleted ones are gone) by provider id."""
        return {job["name"].rsplit("/", 1)[-1]: job for job in self.jobs()}

    def calls_on(self, job_id: str) -> list[tuple[str, str]]:
        """(method, path) of every Fireworks request that names this provider id."""
        out = []
        for req in self.requests():
            if job_id in req["path"] or job_id in req["query"].values():
                out.append((req["method"], req["path"]))
        return out


def create_user(conn: psycopg.Connection[Any], name: str, cap: int = 1) -> int:
    row = conn.execute("SELECT sftq.create_user(%s, %s)", (name, cap)).fetchone()
    assert row is not None
    return int(row[0])


def enqueue(conn: psycopg.Connection[Any], user_id: int, kind: str = "SFT", *,
            gpus: int = 4, body: dict[str, Any] | None = None) -> uuid.UUID:
    row = conn.execute(
        "SELECT id FROM sftq.enqueue(%s, %s, %s::jsonb, NULL, %s)",
        (user_id, kind, psycopg.types.json.Jsonb(body if body is not None else payload(kind)),
         gpus)).fetchone()
    assert row is not None
    return uuid.UUID(str(row[0]))


def cancel(conn: psycopg.Connection[Any], user_id: int, job_id: uuid.UUID) -> str:
    row = conn.execute("SELECT action FROM sftq.cancel(%s, %s)", (user_id, job_id)).fetchone()
    assert row is not None
    return str(row[0])


def job(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM sftq.jobs WHERE id = %s", (job_id,))
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return {col.name: value for col, value in zip(cur.description, row, strict=True)}


def state(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> str:
    return str(job(conn, job_id)["state"])


def states(conn: psycopg.Connection[Any], ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    return {i: state(conn, i) for i in ids}


def events(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> list[dict[str, Any]]:
    cur = conn.execute("SELECT event, actor, from_state, to_state, detail FROM sftq.job_events "
                       "WHERE job_id = %s ORDER BY id", (job_id,))
    assert cur.description is not None
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def progress_ids(conn: psycopg.Connection[Any]) -> set[uuid.UUID]:
    return {uuid.UUID(str(r[0])) for r in
            conn.execute("SELECT id FROM sftq.jobs WHERE state = 'PROGRESS'").fetchall()}


def held_gpus(sim: Simulator) -> float:
    """GPUs really held at the simulator right now (running jobs, ours and external)."""
    quota = sim.quota()
    running = sum(j["sim"]["gpuCount"] for j in sim.jobs()
                  if j["state"] not in ("JOB_STATE_COMPLETED", "JOB_STATE_FAILED",
                                        "JOB_STATE_EXPIRED", "JOB_STATE_EARLY_STOPPED",
                                        "JOB_STATE_CANCELLED", "JOB_STATE_DELETED"))
    return running + float(quota["external_usage"])


# A child process running the real `sftq tick` command. The server CLI is called directly
# (rather than through the `sftq` client entry point) to keep each child's start short.
TICK_CHILD = "import sys; from sftq_server.cli import main; sys.exit(main(sys.argv[1:]))"


def tick_command(db_url: str, sim_url: str) -> list[str]:
    import sys

    return [sys.executable, "-c", TICK_CHILD, "tick", "--database-url", db_url,
            "--simulator-url", sim_url]


def child_env(**overrides: str) -> dict[str, str]:
    import os
    from pathlib import Path

    functions = str(Path(__file__).resolve().parents[2] / "functions")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FIREWORKS_", "SFTQ_", "DATABASE_URL", "SUPABASE_", "SIMULATOR_"))}
    env["PYTHONPATH"] = functions + os.pathsep + env.get("PYTHONPATH", "")
    env.update({"FIREWORKS_API_KEY": API_KEY, "FIREWORKS_ACCOUNT_ID": ACCOUNT})
    # The suite's pre-flight setting (tests/conftest.py): these ticks' payloads are placeholders.
    env["SFTQ_PREFLIGHT"] = os.environ.get("SFTQ_PREFLIGHT", "off")
    env.update(overrides)
    return env


def sim_control(base_url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """Drive the simulator through its HTTP control surface (/_sim/...), as a demo would."""
    import httpx

    with httpx.Client(base_url=base_url, timeout=5.0) as http:
        response = http.post(path, json=body) if body is not None else http.get(path)
    response.raise_for_status()
    return response.json()
