"""An in-memory jobs-api for client tests, served through httpx.MockTransport.

It follows the HTTP spec the client codes against (paths, status codes, error envelope, cursor
paging with X-Next-Cursor and Link), not the real server's code, so the client tests stay
independent of the server package. Tests steer it with ``script`` (responses or exceptions served
before any routing, in order) and ``state_plan`` (the states successive GETs of a job report).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import httpx

API_KEY = "sftq_test_0123456789abcdef"
BASE_URL = "https://sftq.test/functions/v1/jobs-api"
PREFIX = "/functions/v1/jobs-api"

Scripted = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


def error(
    status: int,
    message: str,
    code: str,
    *,
    details: Any = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    body: dict[str, Any] = {"error": message, "code": code}
    if details is not None:
        body["details"] = details
    return httpx.Response(status, json=body, headers=headers)


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FakeClock:
    """Stands in for time.monotonic and both sleeps: sleeping advances the clock instantly."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


class FakeJobsApi:
    def __init__(self, api_key: str = API_KEY) -> None:
        self.api_key = api_key
        self.requests: list[httpx.Request] = []
        self.script: list[Scripted] = []
        self.jobs: dict[str, dict[str, Any]] = {}
        self.idempotency: dict[str, str] = {}
        self.state_plan: dict[str, list[str]] = {}
        self.cancel_status: dict[str, int] = {}
        self.page_header = "x-next-cursor"
        # Each job's history for GET /jobs/{id}/events, and fields its analytics adds.
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.analytics_extra: dict[str, dict[str, Any]] = {}
        self._clock = datetime(2026, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)

    # ---- test helpers -----------------------------------------------------------------------

    def add_job(self, state: str = "QUEUED", kind: str = "SFT", **fields: Any) -> dict[str, Any]:
        self._clock += timedelta(seconds=1)
        job: dict[str, Any] = {
            "id": str(uuid.uuid4()),
            "kind": kind,
            "state": state,
            "display_name": None,
            "gpu_count": 4,
            "created_at": iso(self._clock),
            "started_at": None,
            "completed_at": None,
            "error": None,
            "fireworks_job_name": None,
        }
        job.update(fields)
        self.jobs[job["id"]] = job
        return job

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)

    def calls(self, method: str | None = None) -> list[httpx.Request]:
        return [r for r in self.requests if method is None or r.method == method]

    # ---- the server -------------------------------------------------------------------------

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.script:
            item = self.script.pop(0)
            if isinstance(item, Exception):
                raise item
            if isinstance(item, httpx.Response):
                return item
            return item(request)
        return self.route(request)

    def route(self, request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return error(401, "invalid or missing API key", "unauthorized")
        # Split the raw path before unquoting, so an id holding %2F stays one segment.
        path = request.url.raw_path.decode("ascii").split("?")[0]
        if not path.startswith(PREFIX):
            return error(404, "no such route", "not_found")
        parts = [unquote(p) for p in path[len(PREFIX) :].split("/") if p]
        method = request.method
        if parts == ["health"] and method == "GET":
            return httpx.Response(200, json={"status": "ok", "database": "ok"})
        if parts == ["jobs"] and method == "POST":
            return self._submit(request)
        if parts == ["jobs"] and method == "GET":
            return self._list(request)
        if parts == ["jobs", "analytics", "queue"] and method == "GET":
            return httpx.Response(200, json=QUEUE_BODY)
        if parts == ["jobs", "analytics", "summary"] and method == "GET":
            return httpx.Response(200, json=SUMMARY_BODY)
        if parts == ["capacity"] and method == "GET":
            return httpx.Response(200, json=CAPACITY_BODY)
        if len(parts) == 3 and parts[0] == "jobs" and parts[2] == "analytics":
            job = self.jobs.get(parts[1])
            if job is None:
                return error(404, "job not found", "not_found")
            body = {**JOB_ANALYTICS_BODY, "id": job["id"], "state": job["state"]}
            return httpx.Response(200, json=body | self.analytics_extra.get(job["id"], {}))
        if len(parts) == 3 and parts[0] == "jobs" and parts[2] == "events":
            if parts[1] not in self.jobs:
                return error(404, "job not found", "not_found")
            return self._events(request, parts[1])
        if len(parts) == 2 and parts[0] == "jobs":
            job = self.jobs.get(parts[1])
            if job is None:
                return error(404, "job not found", "not_found")
            if method == "GET":
                plan = self.state_plan.get(job["id"])
                if plan:
                    job["state"] = plan.pop(0)
                return httpx.Response(200, json=job)
            if method == "DELETE":
                return self._cancel(job)
        return error(405, "method not allowed", "method_not_allowed")

    def _submit(self, request: httpx.Request) -> httpx.Response:
        try:
            body = json.loads(request.content)
        except ValueError:
            return error(400, "body is not valid JSON", "invalid_json")
        if not isinstance(body, dict) or "fireworks_payload" not in body:
            return error(400, "fireworks_payload is required", "missing_payload")
        key = request.headers.get("idempotency-key")
        if key and key in self.idempotency:
            job = self.jobs[self.idempotency[key]]
            status = 200
        else:
            job = self.add_job(
                kind=body["kind"],
                display_name=body.get("display_name"),
                gpu_count=body.get("gpu_count", 4),
            )
            if key:
                self.idempotency[key] = job["id"]
            status = 201
        return httpx.Response(
            status,
            json={k: job[k] for k in ("id", "kind", "state", "created_at")},
        )

    def _list(self, request: httpx.Request) -> httpx.Response:
        q = request.url.params
        jobs = sorted(self.jobs.values(), key=lambda j: j["created_at"], reverse=True)
        if "state" in q:
            jobs = [j for j in jobs if j["state"] == q["state"]]
        if "kind" in q:
            jobs = [j for j in jobs if j["kind"] == q["kind"]]
        if "id_prefix" in q:
            jobs = [j for j in jobs if j["id"].replace("-", "").startswith(q["id_prefix"])]
        limit = int(q.get("limit", "100"))
        offset = int(q.get("cursor", "0"))
        page = jobs[offset : offset + limit]
        headers: dict[str, str] = {}
        if offset + limit < len(jobs):
            cursor = str(offset + limit)
            next_url = request.url.copy_merge_params({"cursor": cursor})
            if self.page_header == "x-next-cursor":
                headers["X-Next-Cursor"] = cursor
            headers["Link"] = f'<{next_url}>; rel="next"'
        return httpx.Response(200, json=page, headers=headers)

    def _events(self, request: httpx.Request, job_id: str) -> httpx.Response:
        q = request.url.params
        limit = int(q.get("limit", "50"))
        after = int(q.get("after", "0"))
        rest = [e for e in self.events.get(job_id, []) if int(e["id"]) > after]
        return httpx.Response(200, json={"data": rest[:limit], "has_more": len(rest) > limit})

    def add_event(self, job_id: str, type_: str, state: str, message: str,
                  **data: Any) -> dict[str, Any]:
        self._clock += timedelta(seconds=1)
        event = {"id": str(sum(len(v) for v in self.events.values()) + 1), "job_id": job_id,
                 "type": type_, "state": state, "message": message,
                 "created_at": iso(self._clock), "data": data}
        self.events.setdefault(job_id, []).append(event)
        return event

    def _cancel(self, job: dict[str, Any]) -> httpx.Response:
        if job["state"] in ("SUCCESS", "FAIL", "CANCELLED"):
            return error(409, f"job is already {job['state']}", "job_terminal")
        if job["state"] == "PROGRESS":
            return httpx.Response(
                202,
                json={**job, "message": "cancel recorded; the scheduler finishes it next tick"},
            )
        job["state"] = "CANCELLED"
        job["completed_at"] = job["created_at"]
        return httpx.Response(200, json=job)


QUEUE_BODY: dict[str, Any] = {
    "your_progress_job": {
        "id": "11111111-1111-4111-8111-111111111111",
        "display_name": "qwen3-14b baseline",
        "kind": "SFT",
        "gpu_count": 4,
        "started_at": "2026-05-01T10:01:30Z",
        "fireworks_job_name": "accounts/trilogy/supervisedFineTuningJobs/sftq-1111",
    },
    "your_queued_jobs": [
        {
            "id": "22222222-2222-4222-8222-222222222222",
            "display_name": "dpo follow-up",
            "kind": "DPO",
            "gpu_count": 8,
            "created_at": "2026-05-01T10:02:00Z",
            "queue_position": 2,
        }
    ],
    "global_queue_depth": 5,
    "global_progress_count": 2,
    "global_gpu_in_use": 8,
}

SUMMARY_BODY: dict[str, Any] = {
    "total": 47,
    "by_state": {"QUEUED": 1, "PROGRESS": 0, "SUCCESS": 40, "FAIL": 4, "CANCELLED": 2},
    "by_kind": {"SFT": 30, "DPO": 15, "RFT": 2},
    "success_rate": 0.909,
    "avg_run_duration_seconds": 3720,
    "total_gpu_hours": 413.5,
    "recent_failures": [
        {
            "id": "33333333-3333-4333-8333-333333333333",
            "display_name": "bad lr",
            "kind": "SFT",
            "gpu_count": 4,
            "error": "Fireworks said:\n  learningRate must be positive",
            "failed_at": "2026-05-01T09:00:00Z",
        }
    ],
}

JOB_ANALYTICS_BODY: dict[str, Any] = {
    "id": "filled-in",
    "display_name": "qwen3-14b baseline",
    "kind": "SFT",
    "state": "SUCCESS",
    "gpu_count": 4,
    "fireworks_job_name": "accounts/trilogy/supervisedFineTuningJobs/sftq-1111",
    "timeline": {
        "queued_at": "2026-05-01T10:00:00Z",
        "started_at": "2026-05-01T10:01:30Z",
        "completed_at": "2026-05-01T11:04:15Z",
    },
    "queue_wait_seconds": 90,
    "run_duration_seconds": 3765,
    "gpu_hours": 4.183,
    "error": None,
}

CAPACITY_BODY: dict[str, Any] = {
    "quota": {"id": "training-h200-count", "limit": 64, "usage": 40.5,
              "read_at": "2026-05-01T10:00:00.000000Z"},
    "free_gpus": 23,
    "running": {"jobs": 3, "gpus": 40},
    "queued": {"jobs": 5, "gpus": 24},
    "users": [
        {"name": "ann", "cap": 1, "running_jobs": 1, "running_gpus": 32, "queued_jobs": 2,
         "queued_gpus": 16},
        {"name": "others", "cap": None, "running_jobs": 2, "running_gpus": 8, "queued_jobs": 3,
         "queued_gpus": 8},
    ],
    "scheduler": {"last_tick_at": "2026-05-01T10:00:00.000000Z", "interval_seconds": 30,
                  "healthy": True},
}
