"""The simulator's HTTP surface: the Fireworks paths and the `/_sim` control paths, as a
WSGI application (`Simulator` is the state of `state.SimState` plus this surface)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl
from wsgiref.types import StartResponse, WSGIEnvironment

from sftq_server.simulator.resources import COLLECTIONS as RESOURCE_COLLECTIONS
from sftq_server.simulator.resources import retry_after_header
from sftq_server.simulator.rules import DEFAULT_TIMEOUT_SECONDS
from sftq_server.simulator.state import COLLECTIONS, OTHER_QUOTAS, TERMINAL_STATES, SimState
from sftq_server.simulator.validation import HttpError, error_body

logger = logging.getLogger("sftq_server.simulator")

Json = Any
Response = tuple[int, Json, dict[str, str]]

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
_FAULT_KEYS = frozenset(
    {"error_rate", "statuses", "timeout_rate", "latency_ms", "timeout_seconds", "rules"}
)


class Simulator(SimState):
    """The simulated Fireworks account: state, WSGI app and Python control helpers."""

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
                raise HttpError(404, f"no such path: {path}")
        except HttpError as exc:
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
            rule = faults.scripted(method, path)
            if rule is not None and rule.times is not None:
                self._save()  # one of its answers is spent: a restart must not give it again
            wait = self._rate.admit(self._now()) if rule is None else None
            if rule is not None:
                fault = "rule"
            elif wait is not None:
                fault = "rate_limit"
            elif faults.timeout_rate and self._rng.random() < faults.timeout_rate:
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
        if rule is not None:
            # Scripted: answered instead of the simulator, so nothing is applied.
            headers = {"Retry-After": "1"} if rule.status == 429 else {}
            headers.update(rule.headers)
            return rule.status, rule.body, headers
        if wait is not None:
            # Over the account's request rate: refused, not applied, with when to come back.
            return 429, error_body(429, "rate limit exceeded: too many requests a minute for "
                                   "this account"), {"Retry-After": retry_after_header(wait)}
        if fault == "timeout":
            # Sleep past the client's timeout and drop the request unapplied, as a request
            # lost in a load balancer would be; the client never sees this answer.
            self._sleep(faults.timeout_seconds)
            raise HttpError(504, "deadline exceeded (injected timeout; request not applied)")
        if fault is not None:
            status = int(fault)
            headers = {"Retry-After": "1"} if status == 429 else {}
            return status, error_body(status, f"injected fault: HTTP {status}"), headers

        auth = str(environ.get("HTTP_AUTHORIZATION", ""))
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HttpError(401, "request is missing a valid API key (Authorization: Bearer)")

        parts = path.rstrip("/").split("/")
        # ["", "v1", "accounts", account, *rest]
        if len(parts) < 5 or parts[2] != "accounts":
            raise HttpError(404, f"no such path: {path}")
        readable = len(parts) == 6 and parts[4] in RESOURCE_COLLECTIONS and method == "GET"
        if readable:
            # Datasets, models and evaluators are read by name in any account (public models
            # live under accounts/fireworks).
            with self._lock:
                stamp = self._timestamp(self._now())
                return 200, self._resources.get("/".join(parts[2:]), stamp), {}
        if parts[3] != self.account_id:
            # 403 rather than 404: a wrong account must not read as "your job was deleted".
            raise HttpError(403, f"permission denied on account {parts[3]!r}")
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
                return 200, self._quota_list(query, now), {}
            if len(rest) == 2 and method == "GET":
                if rest[1] in OTHER_QUOTAS and rest[1] != self.quota_id:
                    return 200, self._other_quota(rest[1], now), {}
                if rest[1] != self.quota_id:
                    name = f"accounts/{self.account_id}/quotas/{rest[1]}"
                    raise HttpError(404, f'quota "{name}" not found')
                return 200, self._quota_resource(now), {}
            raise HttpError(405 if len(rest) <= 2 else 404, "method not allowed")
        if head == "supervisedFineTuningJobs:estimateCost" and len(rest) == 1:
            if method != "POST":
                raise HttpError(405, "method not allowed")
            if not parsed_ok:
                raise HttpError(400, "request body is not valid JSON")
            return 200, self._estimate(body, gpu_header), {}
        if head not in COLLECTIONS:
            raise HttpError(404, f"no such collection: {head}")
        kind, id_param = COLLECTIONS[head]
        if len(rest) == 1:
            if method == "POST":
                if not parsed_ok:
                    raise HttpError(400, "request body is not valid JSON")
                return 200, self._create(head, kind, query.get(id_param), body, gpu_header, now), {}
            if method == "GET":
                return 200, self._list(head, query, now), {}
            raise HttpError(405, "method not allowed")
        if len(rest) != 2:
            raise HttpError(404, "no such path")
        job_id, _, verb = rest[1].partition(":")
        try:
            job = self._find(head, job_id)
        except KeyError as exc:
            raise HttpError(404, str(exc.args[0])) from None
        if not verb and method == "GET":
            return 200, self._resource(job, now), {}
        if not verb and method == "DELETE":
            self._delete(head, job_id)
            return 200, {}, {}
        if verb == "cancel" and method == "POST":
            self._cancel(job, now)
            return 200, {}, {}
        raise HttpError(405, "method not allowed")

    # -- the /_sim control surface ----------------------------------------------------------

    def _control(self, method: str, path: str, raw: bytes) -> Response:
        parsed_ok, body = self._parse_json(raw)
        if not parsed_ok:
            raise HttpError(400, "request body is not valid JSON")
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise HttpError(400, "request body must be a JSON object")
        route = path.rstrip("/")
        try:
            return self._control_route(method, route, body)
        except KeyError as exc:
            raise HttpError(404, str(exc.args[0])) from None
        except (ValueError, TypeError) as exc:
            raise HttpError(400, str(exc)) from None

    def _control_route(self, method: str, route: str, body: dict[str, Any]) -> Response:
        if route == "/_sim/health" and method == "GET":
            return 200, {"ok": True, "account": self.account_id}, {}
        if route == "/_sim/quota":
            if method == "GET":
                return 200, self.quota(), {}
            if method == "POST":
                unknown = set(body) - {
                    "maxValue",
                    "value",
                    "external_usage",
                    "usage_lag_seconds",
                    "enforce_quota",
                }
                if unknown:
                    raise ValueError(f"unknown fields: {', '.join(sorted(unknown))}")
                settings = self.set_quota(
                    max_value=body.get("maxValue"),
                    value=body.get("value"),
                    external_usage=body.get("external_usage"),
                    usage_lag_seconds=body.get("usage_lag_seconds"),
                    enforce_quota=body.get("enforce_quota"),
                )
                return 200, settings, {}
        if route == "/_sim/faults":
            if method == "GET":
                return 200, self.faults(), {}
            if method == "POST":
                unknown = set(body) - _FAULT_KEYS
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
                    rules=body.get("rules"),
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
        if route == "/_sim/resources":
            if method == "GET":
                return 200, self.resources(), {}
            if method == "POST":
                return 200, self.set_resources(body), {}
        if route == "/_sim/rate_limit":
            if method == "GET":
                return 200, self.rate_limit(), {}
            if method == "POST":
                return 200, self.set_rate_limit(body), {}
        parts = route.split("/")
        # ["", "_sim", "jobs", collection, "id:state"]: hold it in any state, with progress.
        if len(parts) == 5 and parts[2] == "jobs" and parts[4].endswith(":state"):
            if method != "POST":
                raise HttpError(405, "method not allowed")
            unknown = set(body) - {"state", "jobProgress", "message"}
            if unknown:
                raise ValueError(f"unknown fields: {', '.join(sorted(unknown))}")
            job = self.set_state(parts[3], parts[4].removesuffix(":state"), body.get("state"),
                                 body.get("jobProgress"), body.get("message"))
            return 200, job, {}
        # ["", "_sim", "jobs", collection, "id:finish"]
        if len(parts) == 5 and parts[2] == "jobs" and parts[4].endswith(":finish"):
            if method != "POST":
                raise HttpError(405, "method not allowed")
            state = body.get("state")
            if not isinstance(state, str):
                raise ValueError("state is required")
            unknown = set(body) - {"state", "message", "code"}
            if unknown:
                raise ValueError(f"unknown fields: {', '.join(sorted(unknown))}")
            job = self.finish(
                parts[3], parts[4].removesuffix(":finish"), state, body.get("message"),
                body.get("code"),
            )
            return 200, job, {}
        raise HttpError(404, f"no such control path: {method} {route}")


__all__ = ["TERMINAL_STATES", "Simulator"]
