"""An in-memory Fireworks control plane, served over real HTTP.

It speaks the subset of the Fireworks API the scheduler uses (fine-tuning jobs of the three
kinds, and the training GPU quota) with Fireworks' paths, shapes, validation and error bodies,
so the same provider client talks to it and to Fireworks with only the base URL changed.
A small control surface under `/_sim/...` lets tests and demos move quota, finish jobs,
inject faults and read back every request received. See docs/simulator.md.

Job state is computed lazily from the clock rather than by a background thread, so a fake
clock makes the simulator fully deterministic and there is nothing to stop but the server.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import logging
import random
import signal
import socket
import socketserver
import string
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType, TracebackType
from typing import Any
from urllib.parse import parse_qsl
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIEnvironment

logger = logging.getLogger(__name__)

# collection -> (kind, query parameter that carries the caller-chosen id)
COLLECTIONS: dict[str, tuple[str, str]] = {
    "supervisedFineTuningJobs": ("SFT", "supervisedFineTuningJobId"),
    "dpoJobs": ("DPO", "dpoJobId"),
    "reinforcementFineTuningJobs": ("RFT", "reinforcementFineTuningJobId"),
}
_KIND_TO_COLLECTION = {kind: coll for coll, (kind, _) in COLLECTIONS.items()}

COMPLETED = "JOB_STATE_COMPLETED"
CANCELLED = "JOB_STATE_CANCELLED"
FINISH_STATES = frozenset(
    {
        COMPLETED,
        "JOB_STATE_FAILED",
        "JOB_STATE_EXPIRED",
        "JOB_STATE_EARLY_STOPPED",
        CANCELLED,
    }
)
TERMINAL_STATES = FINISH_STATES | {"JOB_STATE_DELETED"}

# The google.rpc status each HTTP status stands for in an error body.
_RPC_CODES: dict[int, tuple[int, str]] = {
    400: (3, "INVALID_ARGUMENT"),
    401: (16, "UNAUTHENTICATED"),
    403: (7, "PERMISSION_DENIED"),
    404: (5, "NOT_FOUND"),
    405: (12, "UNIMPLEMENTED"),
    408: (4, "DEADLINE_EXCEEDED"),
    409: (6, "ALREADY_EXISTS"),
    429: (8, "RESOURCE_EXHAUSTED"),
    500: (13, "INTERNAL"),
    502: (14, "UNAVAILABLE"),
    503: (14, "UNAVAILABLE"),
    504: (4, "DEADLINE_EXCEEDED"),
}
_FINISH_STATUS = {
    COMPLETED: "OK",
    "JOB_STATE_FAILED": "INTERNAL",
    "JOB_STATE_EXPIRED": "DEADLINE_EXCEEDED",
    "JOB_STATE_EARLY_STOPPED": "OK",
    CANCELLED: "CANCELLED",
}

_OUTPUT_ONLY = frozenset(
    {
        "name",
        "state",
        "status",
        "createTime",
        "updateTime",
        "completedTime",
        "createdBy",
        "jobProgress",
        "estimatedCost",
    }
)

DEFAULT_GPUS = 4
DEFAULT_FAULT_STATUSES = (500, 503, 429)
DEFAULT_TIMEOUT_SECONDS = 15.0
LIST_PAGE_DEFAULT = 50
LIST_PAGE_MAX = 200
# A long-running demo server must not grow without bound; tests stay far below this.
MAX_RECORDED_REQUESTS = 100_000
_ID_CHARS = frozenset(string.ascii_lowercase + string.digits + "-")

Json = Any
Response = tuple[int, Json, dict[str, str]]


class _HttpError(Exception):
    """An error answer: an HTTP status with a google-style body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(status: int, message: str) -> dict[str, Any]:
    code = _RPC_CODES.get(status, (2, "UNKNOWN"))[0]
    return {"code": code, "message": message, "details": []}


def _valid_id(value: str) -> bool:
    return (
        0 < len(value) <= 63
        and set(value) <= _ID_CHARS
        and not value.startswith("-")
        and not value.endswith("-")
    )


def _number(value: object, field: str, *, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ValueError(f"{field} must be a number >= {minimum:g}")
    return float(value)


def _integer(value: object, field: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}")
    return value


def _rate(value: object, field: str) -> float:
    rate = _number(value, field)
    if rate > 1:
        raise ValueError(f"{field} must be between 0 and 1")
    return rate


def _positive_int(value: object) -> int | None:
    """A GPU-count hint as an int, or None when it is absent or not a positive integer."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


def job_gpus(payload: dict[str, Any], header: str | None) -> int:
    """The GPUs a simulated job holds while it runs.

    The X-Sftq-Gpu-Count header (sent by our provider client) wins; otherwise the payload's
    own hints, `acceleratorCount` (top level or in `trainingConfig`) times the node count
    (`nodeCount` or SFT's `nodes` at top level, or `trainingConfig.nodeCount`; default 1);
    otherwise 4, the contract's default gpu_count.
    """
    from_header = _positive_int(header.strip()) if header is not None else None
    if from_header is not None:
        return from_header
    training = payload.get("trainingConfig")
    training = training if isinstance(training, dict) else {}
    accelerators = _positive_int(payload.get("acceleratorCount")) or _positive_int(
        training.get("acceleratorCount")
    )
    if accelerators is None:
        return DEFAULT_GPUS
    nodes = (
        _positive_int(payload.get("nodeCount"))
        or _positive_int(payload.get("nodes"))
        or _positive_int(training.get("nodeCount"))
    )
    return accelerators * (nodes or 1)


def validate_payload(kind: str, payload: object) -> None:
    """Reject what Fireworks rejects at create time (a subset: the required fields)."""
    if not isinstance(payload, dict):
        raise _HttpError(400, "request body must be a JSON object")
    required = ("dataset", "evaluator") if kind == "RFT" else ("dataset",)
    for field in required:
        value = payload.get(field)
        if not isinstance(value, str) or not value:
            raise _HttpError(400, f'invalid argument: field "{field}" is required')
    if kind == "RFT":
        params = payload.get("inferenceParameters")
        count = params.get("responseCandidatesCount") if isinstance(params, dict) else None
        parsed = _positive_int(count)
        if parsed is None or parsed < 2:
            raise _HttpError(
                400,
                "invalid argument: inferenceParameters.responseCandidatesCount must be >= 2 "
                f"for reinforcement fine-tuning, got {count!r}",
            )


@dataclass
class _Job:
    collection: str
    job_id: str
    payload: dict[str, Any]
    gpus: int
    created: float
    job_seconds: float
    final_state: str | None = None
    final_message: str | None = None
    final_at: float | None = None


@dataclass(frozen=True)
class _Faults:
    error_rate: float = 0.0
    statuses: tuple[int, ...] = DEFAULT_FAULT_STATUSES
    timeout_rate: float = 0.0
    latency_ms: int = 0
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS

    def as_json(self) -> dict[str, Any]:
        return {
            "error_rate": self.error_rate,
            "statuses": list(self.statuses),
            "timeout_rate": self.timeout_rate,
            "latency_ms": self.latency_ms,
            "timeout_seconds": self.timeout_seconds,
        }


class Simulator:
    """The simulated Fireworks account: state, WSGI app and Python control helpers."""

    def __init__(
        self,
        *,
        account_id: str = "sim-account",
        job_seconds: float = 60.0,
        max_value: int = 64,
        value: int | None = None,
        quota_id: str = "training-h200-count",
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
    ) -> None:
        if job_seconds < 0:
            raise ValueError("job_seconds must be >= 0 (0: jobs never finish on their own)")
        self.account_id = account_id
        self.job_seconds = float(job_seconds)
        self.quota_id = quota_id
        self._default_max_value = _integer(max_value, "max_value")
        self._default_value = None if value is None else _integer(value, "value")
        self._clock = clock
        self._seed = seed
        # Wall-clock timestamps are derived from the (possibly fake) clock so that they move
        # with it: createTime and completedTime agree with the lifecycle the clock drives.
        self._t0 = clock()
        self._epoch = time.time()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._reset_locked()

    # -- state ------------------------------------------------------------------------------

    def _reset_locked(self) -> None:
        self._jobs: dict[tuple[str, str], _Job] = {}
        self._requests: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED_REQUESTS)
        self._faults = _Faults()
        self._rng = random.Random(self._seed)
        self._max_value = self._default_max_value
        self._value = (
            self._default_max_value if self._default_value is None else self._default_value
        )
        self._external_usage: float = 0
        self._usage_lag = 0.0
        self._offset = 0.0

    def _now(self) -> float:
        return self._clock() + self._offset

    def _timestamp(self, at: float) -> str:
        moment = datetime.fromtimestamp(self._epoch + (at - self._t0), tz=UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def _creating_seconds(self, job: _Job) -> float:
        return min(1.0, job.job_seconds / 10)

    def _state(self, job: _Job, now: float) -> tuple[str, float]:
        """The job's state at `now` and when it entered it."""
        if job.final_state is not None and job.final_at is not None:
            return job.final_state, job.final_at
        elapsed = now - job.created
        if job.job_seconds > 0 and elapsed >= job.job_seconds:
            return COMPLETED, job.created + job.job_seconds
        creating = self._creating_seconds(job)
        if elapsed < creating:
            return "JOB_STATE_CREATING", job.created
        return "JOB_STATE_RUNNING", job.created + creating

    def _resource(self, job: _Job, now: float) -> dict[str, Any]:
        state, since = self._state(job, now)
        # Output-only fields in a create body are ignored by Fireworks, never echoed.
        resource = {k: copy.deepcopy(v) for k, v in job.payload.items() if k not in _OUTPUT_ONLY}
        resource.setdefault("displayName", job.job_id)
        resource["name"] = f"accounts/{self.account_id}/{job.collection}/{job.job_id}"
        resource["state"] = state
        if state in FINISH_STATES:
            code = _FINISH_STATUS[state]
            resource["status"] = {"code": code, "message": job.final_message or ""}
        else:
            resource["status"] = {"code": "OK", "message": ""}
        resource["createTime"] = self._timestamp(job.created)
        resource["updateTime"] = self._timestamp(since)
        if state in TERMINAL_STATES:
            resource["completedTime"] = self._timestamp(since)
        if state == "JOB_STATE_RUNNING" and job.job_seconds > 0:
            percent = int(100 * (now - job.created) / job.job_seconds)
            resource["jobProgress"] = {"percent": max(0, min(99, percent))}
        elif state == COMPLETED:
            resource["jobProgress"] = {"percent": 100}
        return resource

    def _usage(self, now: float) -> float:
        held = sum(
            job.gpus
            for job in self._jobs.values()
            if now - job.created >= self._usage_lag
            and self._state(job, now)[0] not in TERMINAL_STATES
        )
        return held + self._external_usage

    def _quota_resource(self, now: float) -> dict[str, Any]:
        usage = self._usage(now)
        return {
            "name": f"accounts/{self.account_id}/quotas/{self.quota_id}",
            # int64 values travel as strings in Fireworks' JSON; usage is a double.
            "value": str(self._value),
            "maxValue": str(self._max_value),
            "usage": int(usage) if float(usage).is_integer() else usage,
            "updateTime": self._timestamp(now),
        }

    def _quota_settings(self) -> dict[str, Any]:
        return {
            "maxValue": self._max_value,
            "value": self._value,
            "external_usage": self._external_usage,
            "usage_lag_seconds": self._usage_lag,
            "quota": self._quota_resource(self._now()),
        }

    def _find(self, collection: str, job_id: str) -> _Job:
        if collection in _KIND_TO_COLLECTION:
            collection = _KIND_TO_COLLECTION[collection]
        job = self._jobs.get((collection, job_id))
        if job is None:
            name = f"accounts/{self.account_id}/{collection}/{job_id}"
            raise KeyError(f'{collection[:-1]} "{name}" not found')
        return job

    def _release_sleepers(self) -> None:
        # Injected timeouts and latency sleep on this event, so stopping or resetting the
        # simulator never waits out a 15-second fault.
        with self._lock:
            wake, self._wake = self._wake, threading.Event()
        wake.set()

    def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        with self._lock:
            wake = self._wake
        wake.wait(seconds)

    # -- Python control helpers (same semantics as /_sim) -----------------------------------

    def set_quota(
        self,
        *,
        max_value: int | None = None,
        value: int | None = None,
        external_usage: float | None = None,
        usage_lag_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Change the quota; `value` follows `max_value` unless given. Returns the settings."""
        new_max = None if max_value is None else _integer(max_value, "maxValue")
        new_value = None if value is None else _integer(value, "value")
        ext = None if external_usage is None else _number(external_usage, "external_usage")
        lag = None if usage_lag_seconds is None else _number(usage_lag_seconds, "usage_lag")
        with self._lock:
            if new_max is not None:
                self._max_value = new_max
                self._value = new_max if new_value is None else new_value
            elif new_value is not None:
                self._value = new_value
            if ext is not None:
                self._external_usage = int(ext) if ext.is_integer() else ext
            if lag is not None:
                self._usage_lag = lag
            return self._quota_settings()

    def quota(self) -> dict[str, Any]:
        """The quota settings and the quota resource as GET .../quotas/{id} shows it now."""
        with self._lock:
            return self._quota_settings()

    def finish(
        self, collection: str, job_id: str, state: str, message: str | None = None
    ) -> dict[str, Any]:
        """Force a job into a terminal state (KeyError if unknown, ValueError if bad state).

        `collection` may also be a kind name (SFT, DPO, RFT).
        """
        if state not in FINISH_STATES:
            raise ValueError(f"state must be one of {', '.join(sorted(FINISH_STATES))}")
        if message is not None and not isinstance(message, str):
            raise ValueError("message must be a string")
        with self._lock:
            job = self._find(collection, job_id)
            now = self._now()
            job.final_state = state
            job.final_message = message
            job.final_at = now
            return self._resource(job, now)

    def set_faults(
        self,
        *,
        error_rate: float = 0.0,
        statuses: Sequence[int] | None = None,
        timeout_rate: float = 0.0,
        latency_ms: int = 0,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> dict[str, Any]:
        """Replace the fault settings (no arguments clears them). Returns the new settings."""
        chosen = tuple(DEFAULT_FAULT_STATUSES if statuses is None else statuses)
        if not chosen or any(
            isinstance(s, bool) or not isinstance(s, int) or not 400 <= s <= 599 for s in chosen
        ):
            raise ValueError("statuses must be a non-empty list of HTTP error statuses (4xx/5xx)")
        faults = _Faults(
            error_rate=_rate(error_rate, "error_rate"),
            statuses=chosen,
            timeout_rate=_rate(timeout_rate, "timeout_rate"),
            latency_ms=_integer(latency_ms, "latency_ms"),
            timeout_seconds=_number(timeout_seconds, "timeout_seconds"),
        )
        with self._lock:
            self._faults = faults
        return faults.as_json()

    def faults(self) -> dict[str, Any]:
        with self._lock:
            return self._faults.as_json()

    def requests(self) -> list[dict[str, Any]]:
        """Every Fireworks-path request received so far, oldest first."""
        with self._lock:
            return copy.deepcopy(list(self._requests))

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def jobs(self) -> list[dict[str, Any]]:
        """Every job not deleted, as GET would show it, plus a "sim" object with its
        collection, GPU count and whether it counts in quota usage now."""
        with self._lock:
            now = self._now()
            result = []
            for job in self._jobs.values():
                resource = self._resource(job, now)
                resource["sim"] = {
                    "collection": job.collection,
                    "kind": COLLECTIONS[job.collection][0],
                    "gpuCount": job.gpus,
                    "countsInUsage": resource["state"] not in TERMINAL_STATES
                    and now - job.created >= self._usage_lag,
                }
                result.append(resource)
            return result

    def advance(self, seconds: float) -> float:
        """Move simulated time forward (for demos and e2e runs against a real process)."""
        step = _number(seconds, "seconds")
        with self._lock:
            self._offset += step
            return self._offset

    def reset(self) -> None:
        """Back to the constructor's state: no jobs, requests or faults, default quota."""
        with self._lock:
            self._reset_locked()
        self._release_sleepers()

    # -- WSGI -------------------------------------------------------------------------------

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        path = str(environ.get("PATH_INFO", "") or "/")
        query = dict(parse_qsl(str(environ.get("QUERY_STRING", "")), keep_blank_values=True))
        raw = self._read_body(environ)
        try:
            if path == "/_sim" or path.startswith("/_sim/"):
                status, body, headers = self._control(method, path, raw)
            elif path.startswith("/v1/"):
                status, body, headers = self._fireworks(environ, method, path, query, raw)
            else:
                raise _HttpError(404, f"no such path: {path}")
        except _HttpError as exc:
            status, body, headers = exc.status, error_body(exc.status, exc.message), {}
        except Exception:
            logger.exception("simulator: unhandled error on %s %s", method, path)
            status, body, headers = 500, error_body(500, "internal simulator error"), {}
        payload = json.dumps(body).encode()
        reason = _REASONS.get(status, "Error")
        start_response(
            f"{status} {reason}",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(payload))),
                *headers.items(),
            ],
        )
        return [payload]

    @staticmethod
    def _read_body(environ: WSGIEnvironment) -> bytes:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length <= 0:
            return b""
        stream = environ["wsgi.input"]
        data: bytes = stream.read(length)
        return data

    @staticmethod
    def _parse_json(raw: bytes) -> tuple[bool, Json]:
        if not raw.strip():
            return True, None
        try:
            return True, json.loads(raw)
        except ValueError:
            return False, None

    # -- the Fireworks paths ----------------------------------------------------------------

    def _fireworks(
        self,
        environ: WSGIEnvironment,
        method: str,
        path: str,
        query: dict[str, str],
        raw: bytes,
    ) -> Response:
        parsed_ok, body = self._parse_json(raw)
        gpu_header = environ.get("HTTP_X_SFTQ_GPU_COUNT")
        with self._lock:
            faults = self._faults
            fault: str | None = None
            if faults.timeout_rate and self._rng.random() < faults.timeout_rate:
                fault = "timeout"
            elif faults.error_rate and self._rng.random() < faults.error_rate:
                fault = str(self._rng.choice(faults.statuses))
            self._requests.append(
                {
                    "method": method,
                    "path": path,
                    "query": query,
                    "body": body if parsed_ok else None,
                    "fault": fault,
                    "gpu_count": gpu_header,
                }
            )
        self._sleep(faults.latency_ms / 1000)
        if fault == "timeout":
            # Sleep past the client's timeout and drop the request unapplied, as a request
            # lost in a load balancer would be; the client never sees this answer.
            self._sleep(faults.timeout_seconds)
            raise _HttpError(504, "deadline exceeded (injected timeout; request not applied)")
        if fault is not None:
            status = int(fault)
            headers = {"Retry-After": "1"} if status == 429 else {}
            return status, error_body(status, f"injected fault: HTTP {status}"), headers

        auth = str(environ.get("HTTP_AUTHORIZATION", ""))
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _HttpError(401, "request is missing a valid API key (Authorization: Bearer)")

        parts = path.rstrip("/").split("/")
        # ["", "v1", "accounts", account, *rest]
        if len(parts) < 5 or parts[2] != "accounts":
            raise _HttpError(404, f"no such path: {path}")
        if parts[3] != self.account_id:
            # 403 rather than 404: a wrong account must not read as "your job was deleted".
            raise _HttpError(403, f"permission denied on account {parts[3]!r}")
        rest = parts[4:]
        with self._lock:
            return self._route(method, rest, query, parsed_ok, body, gpu_header)

    def _route(
        self,
        method: str,
        rest: list[str],
        query: dict[str, str],
        parsed_ok: bool,
        body: Json,
        gpu_header: str | None,
    ) -> Response:
        now = self._now()
        head = rest[0]
        if head == "quotas":
            if len(rest) == 1 and method == "GET":
                quota = self._quota_resource(now)
                return 200, {"quotas": [quota], "totalSize": 1}, {}
            if len(rest) == 2 and method == "GET":
                if rest[1] != self.quota_id:
                    name = f"accounts/{self.account_id}/quotas/{rest[1]}"
                    raise _HttpError(404, f'quota "{name}" not found')
                return 200, self._quota_resource(now), {}
            raise _HttpError(405 if len(rest) <= 2 else 404, "method not allowed")
        if head not in COLLECTIONS:
            raise _HttpError(404, f"no such collection: {head}")
        kind, id_param = COLLECTIONS[head]
        if len(rest) == 1:
            if method == "POST":
                if not parsed_ok:
                    raise _HttpError(400, "request body is not valid JSON")
                return self._create(head, kind, query.get(id_param), body, gpu_header, now)
            if method == "GET":
                return self._list(head, query, now)
            raise _HttpError(405, "method not allowed")
        if len(rest) != 2:
            raise _HttpError(404, "no such path")
        job_id, _, verb = rest[1].partition(":")
        try:
            job = self._find(head, job_id)
        except KeyError as exc:
            raise _HttpError(404, str(exc.args[0])) from None
        if not verb and method == "GET":
            return 200, self._resource(job, now), {}
        if not verb and method == "DELETE":
            # Fireworks removes the resource (possibly via JOB_STATE_DELETING); here at once.
            del self._jobs[(head, job_id)]
            return 200, {}, {}
        if verb == "cancel" and method == "POST":
            # Cancelling a finished job leaves it as it is (Fireworks' behaviour here is
            # unconfirmed; answering 200 keeps a cancel that races completion harmless).
            if job.final_state is None and self._state(job, now)[0] not in TERMINAL_STATES:
                job.final_state, job.final_message, job.final_at = CANCELLED, None, now
            return 200, {}, {}
        raise _HttpError(405, "method not allowed")

    def _create(
        self,
        collection: str,
        kind: str,
        job_id: str | None,
        body: Json,
        gpu_header: str | None,
        now: float,
    ) -> Response:
        validate_payload(kind, body)
        payload: dict[str, Any] = body
        if job_id is None or job_id == "":
            job_id = self._generate_id(collection)
        elif not _valid_id(job_id):
            raise _HttpError(
                400,
                f"invalid argument: id {job_id!r} must be 1-63 characters of [a-z0-9-], "
                "not starting or ending with '-'",
            )
        if (collection, job_id) in self._jobs:
            name = f"accounts/{self.account_id}/{collection}/{job_id}"
            raise _HttpError(409, f'{collection[:-1]} "{name}" already exists')
        job = _Job(
            collection=collection,
            job_id=job_id,
            payload=copy.deepcopy(payload),
            gpus=job_gpus(payload, gpu_header),
            created=now,
            job_seconds=self.job_seconds,
        )
        self._jobs[(collection, job_id)] = job
        return 200, self._resource(job, now), {}

    def _generate_id(self, collection: str) -> str:
        alphabet = string.ascii_lowercase + string.digits
        while True:
            candidate = self._rng.choice(string.ascii_lowercase) + "".join(
                self._rng.choice(alphabet) for _ in range(15)
            )
            if (collection, candidate) not in self._jobs:
                return candidate

    def _list(self, collection: str, query: dict[str, str], now: float) -> Response:
        raw_size = query.get("pageSize", "")
        try:
            size = int(raw_size) if raw_size else 0
        except ValueError:
            raise _HttpError(400, f"invalid argument: pageSize {raw_size!r}") from None
        if size < 0:
            raise _HttpError(400, "invalid argument: pageSize must not be negative")
        size = min(size or LIST_PAGE_DEFAULT, LIST_PAGE_MAX)
        after = self._decode_token(collection, query.get("pageToken", ""))
        # Fireworks' default order is by name. Tokens carry the last name served (a keyset,
        # not an offset), so jobs created or deleted between pages never shift a page.
        # `filter` and `orderBy` are accepted and ignored.
        jobs = sorted(
            (job for (coll, _), job in self._jobs.items() if coll == collection),
            key=lambda job: job.job_id,
        )
        remaining = [job for job in jobs if job.job_id > after] if after else jobs
        page = remaining[:size]
        envelope: dict[str, Any] = {
            collection: [self._resource(job, now) for job in page],
            "totalSize": len(jobs),
        }
        if len(remaining) > size:
            envelope["nextPageToken"] = self._encode_token(collection, page[-1].job_id)
        return 200, envelope, {}

    @staticmethod
    def _encode_token(collection: str, last_id: str) -> str:
        return base64.urlsafe_b64encode(f"{collection}/{last_id}".encode()).decode().rstrip("=")

    @staticmethod
    def _decode_token(collection: str, token: str) -> str:
        if not token:
            return ""
        try:
            padded = token + "=" * (-len(token) % 4)
            coll, _, last_id = base64.urlsafe_b64decode(padded).decode().partition("/")
            if coll == collection and _valid_id(last_id):
                return last_id
        except (binascii.Error, UnicodeDecodeError, ValueError):
            pass
        raise _HttpError(400, "invalid argument: pageToken")

    # -- the /_sim control surface ----------------------------------------------------------

    def _control(self, method: str, path: str, raw: bytes) -> Response:
        parsed_ok, body = self._parse_json(raw)
        if not parsed_ok:
            raise _HttpError(400, "request body is not valid JSON")
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise _HttpError(400, "request body must be a JSON object")
        route = path.rstrip("/")
        try:
            return self._control_route(method, route, body)
        except KeyError as exc:
            raise _HttpError(404, str(exc.args[0])) from None
        except (ValueError, TypeError) as exc:
            raise _HttpError(400, str(exc)) from None

    def _control_route(self, method: str, route: str, body: dict[str, Any]) -> Response:
        if route == "/_sim/health" and method == "GET":
            return 200, {"ok": True, "account": self.account_id}, {}
        if route == "/_sim/quota":
            if method == "GET":
                return 200, self.quota(), {}
            if method == "POST":
                unknown = set(body) - {"maxValue", "value", "external_usage", "usage_lag_seconds"}
                if unknown:
                    raise ValueError(f"unknown fields: {', '.join(sorted(unknown))}")
                settings = self.set_quota(
                    max_value=body.get("maxValue"),
                    value=body.get("value"),
                    external_usage=body.get("external_usage"),
                    usage_lag_seconds=body.get("usage_lag_seconds"),
                )
                return 200, settings, {}
        if route == "/_sim/faults":
            if method == "GET":
                return 200, self.faults(), {}
            if method == "POST":
                allowed = {
                    "error_rate",
                    "statuses",
                    "timeout_rate",
                    "latency_ms",
                    "timeout_seconds",
                }
                unknown = set(body) - allowed
                if unknown:
                    raise ValueError(f"unknown fields: {', '.join(sorted(unknown))}")
                statuses = body.get("statuses")
                if statuses is not None and not isinstance(statuses, list):
                    raise ValueError("statuses must be a list")
                settings = self.set_faults(
                    error_rate=body.get("error_rate", 0.0),
                    statuses=statuses,
                    timeout_rate=body.get("timeout_rate", 0.0),
                    latency_ms=body.get("latency_ms", 0),
                    timeout_seconds=body.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS),
                )
                return 200, settings, {}
        if route == "/_sim/requests":
            if method == "GET":
                return 200, self.requests(), {}
            if method == "DELETE":
                self.clear_requests()
                return 200, {}, {}
        if route == "/_sim/reset" and method == "POST":
            self.reset()
            return 200, {}, {}
        if route == "/_sim/advance" and method == "POST":
            offset = self.advance(body.get("seconds", 0))
            return 200, {"offset_seconds": offset}, {}
        if route == "/_sim/jobs" and method == "GET":
            return 200, self.jobs(), {}
        parts = route.split("/")
        # ["", "_sim", "jobs", collection, "id:finish"]
        if len(parts) == 5 and parts[2] == "jobs" and parts[4].endswith(":finish"):
            if method != "POST":
                raise _HttpError(405, "method not allowed")
            state = body.get("state")
            if not isinstance(state, str):
                raise ValueError("state is required")
            job = self.finish(
                parts[3], parts[4].removesuffix(":finish"), state, body.get("message")
            )
            return 200, job, {}
        raise _HttpError(404, f"no such control path: {method} {route}")


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class _QuietHandler(WSGIRequestHandler):
    """wsgiref's handler, logging through `logging` at debug instead of onto stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("simulator %s - %s", self.address_string(), format % args)

    def address_string(self) -> str:
        return str(self.client_address[0])


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    # Non-daemon handler threads joined on close: stop() leaves no thread behind. wsgiref
    # answers one request per connection, so no idle keep-alive connection can hold a join.
    daemon_threads = False
    block_on_close = True
    # socketserver's default backlog of 5 drops SYNs under a burst of parallel clients, and
    # each drop costs the client a one-second retransmit.
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (our injected timeouts) closes its socket mid-answer.
        logger.debug("simulator: error serving %s", client_address, exc_info=True)


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class SimulatorServer:
    """The simulator on a background thread, for tests: `with SimulatorServer() as srv:`."""

    def __init__(
        self, simulator: Simulator | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.simulator = simulator if simulator is not None else Simulator()
        self.host = host
        self.port = port
        self._server: _ThreadingServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the simulator server is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> SimulatorServer:
        if self._server is not None:
            return self
        server_class = _ThreadingServer6 if ":" in self.host else _ThreadingServer
        server = server_class((self.host, self.port), _QuietHandler)
        server.set_app(self.simulator)
        self.port = int(server.server_address[1])
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=f"sftq-simulator-{self.port}",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = self._thread = None
        self.simulator._release_sleepers()
        server.shutdown()
        if thread is not None:
            thread.join()
        server.server_close()

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve(
    host: str,
    port: int,
    job_seconds: float,
    account_id: str = "sim-account",
    max_value: int = 64,
) -> None:
    """Run the simulator until SIGTERM or SIGINT (blocking); for `sftq simulator`."""
    simulator = Simulator(account_id=account_id, job_seconds=job_seconds, max_value=max_value)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    server = SimulatorServer(simulator, host=host, port=port).start()
    try:
        print(f"simulator listening on {server.url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sftq_server.simulator [--host H] [--port N] [--job-seconds S] ...`."""
    import argparse

    parser = argparse.ArgumentParser(prog="sftq-simulator", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--job-seconds", type=float, default=60.0)
    parser.add_argument("--account-id", default="sim-account")
    parser.add_argument("--max-value", type=int, default=64)
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.job_seconds, args.account_id, args.max_value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
