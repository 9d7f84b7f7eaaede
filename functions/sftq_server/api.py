"""jobs-api and analytics: authenticate, validate, call ONE procedure, pass its JSON through.

Each request costs one database round trip (two for a cancel the provider confirms). The
procedures (sql/procedures/100_api.sql) authenticate the key hash and answer the response body
as JSON text; nothing here re-parses or re-shapes it. Python only refuses what it can refuse
without the database: a malformed key, an invalid body or query, a path id that is not a UUID.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from pydantic import ValidationError

from . import db as dbmod
from .api_retry import retry_job
from .errors import BadRequest, NotFound, SftqError, Unauthorized, Unavailable, UnsupportedMediaType
from .group_commit import Answer, GroupCommit, Params
from .models import (
    DEFAULT_PAGE_SIZE,
    KINDS,
    MAX_DISPLAY_NAME,
    MAX_GPU_COUNT,
    MAX_IDEMPOTENCY_KEY,
    MAX_PAGE_SIZE,
    MAX_QUEUE_TIMEOUT,
    STATES,
    SUBMIT_FIELDS,
    SubmitRequest,
)
from .settings import Settings
from .stream_paths import stream_unavailable
from .web import JSON_HEADERS, App, Request, Response, Router

logger = logging.getLogger("sftq.api")

# Keys are "sftq_" + 48 hex today; a little slack for other key generations, but nothing that
# could not be a key gets hashed and sent to the database.
_KEY_RE = re.compile(r"sftq_[A-Za-z0-9_-]{8,200}")
# Canonical 8-4-4-4-12 only: uuid.UUID would also take braces, urn: and bare hex.
_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
_CURSOR_RE = re.compile(r"[0-9]{1,17}_[0-9a-f]{32}")
_LIMIT_RE = re.compile(r"[0-9]{1,4}")
_IDEMPOTENCY_RE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
_LIST_PARAMS = frozenset({"state", "kind", "limit", "cursor", "id_prefix"})
_ID_PREFIX_RE = re.compile(r"[0-9a-fA-F-]{8,36}")
_KEY_PREFIX_LEN = 13  # what sftq.api_keys.prefix stores: safe to log, useless to an attacker

CANCEL_PENDING_MESSAGE = "cancel recorded; the scheduler will finish it at its next tick"
OPENAPI_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


class JobStopper(Protocol):
    """What a cancel needs from the provider client (sftq_server.provider.FireworksClient)."""

    def stop_job(self, kind: str, job_id: str) -> str: ...


ProviderFactory = Callable[[], JobStopper]


def default_provider_factory(settings: Settings) -> ProviderFactory:
    def build() -> JobStopper:
        # Imported here: httpx and the client load only when a running job is cancelled.
        from .provider import FireworksClient

        return FireworksClient(
            base_url=settings.fireworks_base_url,
            api_key=settings.fireworks_api_key,
            account_id=settings.fireworks_account_id,
            quota_id=settings.fireworks_quota_id,
            timeout=settings.fireworks_timeout_seconds,
        )

    return build


def analytics_database_url(settings: Settings) -> str:
    """Analytics may read from a replica: ANALYTICS_DATABASE_URL, else the main database."""
    return os.environ.get("ANALYTICS_DATABASE_URL") or settings.database_url


# --- request checks -----------------------------------------------------------------------

def authenticate(request: Request) -> bytes:
    """The SHA-256 of a well-formed bearer key (the database decides whether it is valid)."""
    auth = request.headers.get("authorization")
    if not auth:
        raise Unauthorized("missing Authorization header; send Authorization: Bearer sftq_...")
    scheme, _, key = auth.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise Unauthorized("Authorization must be: Bearer sftq_...")
    if not _KEY_RE.fullmatch(key):
        raise Unauthorized("malformed API key; keys start with sftq_")
    request.user = key[:_KEY_PREFIX_LEN]
    return hashlib.sha256(key.encode()).digest()


def job_id_param(request: Request, raw: str) -> str:
    # A malformed id names no job: 404 like any other id that is not the caller's.
    if not _UUID_RE.fullmatch(raw):
        raise NotFound("job not found")
    job_id = raw.lower()
    request.job_id = job_id
    return job_id


def idempotency_key(request: Request) -> str | None:
    key: str | None = request.headers.get("idempotency-key")
    if key is None:
        return None
    if len(key) > MAX_IDEMPOTENCY_KEY or not _IDEMPOTENCY_RE.fullmatch(key):
        raise BadRequest(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII "
                         "characters")
    return key


def check_json_content_type(request: Request) -> None:
    ctype: str = request.headers.get("content-type", "")
    media, _, params = ctype.partition(";")
    if media.strip().lower() != "application/json":
        raise UnsupportedMediaType("Content-Type must be application/json")
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
                "utf-8", "utf8"):
            raise UnsupportedMediaType("JSON bodies must be UTF-8 (charset=utf-8)")


_FIELD_MESSAGES = {
    "kind": "kind must be one of " + ", ".join(KINDS),
    "fireworks_payload": "fireworks_payload must be a JSON object",
    "gpu_count": f"gpu_count must be an integer from 1 to {MAX_GPU_COUNT}",
    "display_name": f"display_name must be a string of at most {MAX_DISPLAY_NAME} characters",
    "queue_timeout_seconds": f"queue_timeout_seconds must be an integer from 1 to "
                             f"{MAX_QUEUE_TIMEOUT} (30 days)",
}


def parse_submit(body: bytes) -> tuple[SubmitRequest, str]:
    """Validate a POST /jobs body; answer the request and fireworks_payload as JSON text."""
    try:
        req = SubmitRequest.model_validate_json(body)
    except ValidationError as exc:
        raise _submit_error(exc) from None
    try:
        payload = json.dumps(req.fireworks_payload, ensure_ascii=False, allow_nan=False,
                             separators=(",", ":"))
    except ValueError:
        raise BadRequest("request body is not valid JSON: NaN, Infinity and out-of-range numbers "
                         "are not allowed", code="invalid_json") from None
    # PostgreSQL text and jsonb cannot hold U+0000; only a body that spells it needs the walk.
    if b"\\u0000" in body and (_has_nul(req.fireworks_payload)
                                or "\x00" in (req.display_name or "")):
        raise BadRequest("strings must not contain the NUL character (\\u0000)")
    return req, payload


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in k or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _submit_error(exc: ValidationError) -> SftqError:
    errors = exc.errors(include_url=False, include_context=False)
    for err in errors:
        if err["type"] == "json_invalid":
            reason = err["msg"].removeprefix("Invalid JSON: ")
            return BadRequest(f"request body is not valid JSON: {reason}", code="invalid_json")
        if err["loc"] == ():
            return BadRequest("request body must be a JSON object: "
                              "{\"kind\": ..., \"fireworks_payload\": {...}}")
    # The contract's answer to the commonest mistake (posting the bare Fireworks body) comes first.
    for err in errors:
        if err["loc"] == ("fireworks_payload",) and (
                err["type"] == "missing" or err.get("input") is None):
            return BadRequest("fireworks_payload is required", code="missing_payload")
    unknown = sorted(str(err["loc"][0]) for err in errors if err["type"] == "extra_forbidden")
    if unknown:
        allowed = sorted(SUBMIT_FIELDS)
        return BadRequest(f"unknown field(s): {', '.join(unknown)}; "
                          f"allowed fields: {', '.join(allowed)}",
                          code="unknown_field",
                          detail={"unknown_fields": unknown, "allowed_fields": allowed})
    details: list[dict[str, str]] = []
    for err in errors:
        field = str(err["loc"][0]) if err["loc"] else ""
        message = "kind is required" if (field, err["type"]) == ("kind", "missing") else \
            _FIELD_MESSAGES.get(field, err["msg"])
        if not any(d["field"] == field for d in details):
            details.append({"field": field, "message": message})
    return BadRequest("; ".join(d["message"] for d in details), detail=details)


def submit_headers(request: Request) -> tuple[bytes, str | None]:
    """POST /jobs before its body is read: the key's hash and the Idempotency-Key."""
    key_hash = authenticate(request)
    check_json_content_type(request)
    return key_hash, idempotency_key(request)


def submit_params(key_hash: bytes, idem: str | None, body: bytes) -> Params:
    """POST /jobs: what the group commit takes, from the checked headers and the body."""
    req, payload = parse_submit(body)
    return (key_hash, req.kind, payload, req.display_name, req.gpu_count, idem,
            req.queue_timeout_seconds)


def created(request: Request, answer: Answer) -> Response:
    """POST /jobs: the 201 for the group commit's answer."""
    body, replayed, job_id = answer
    request.job_id = job_id
    headers = [*JSON_HEADERS, ("Location", f"{request.script_name}/jobs/{job_id}")]
    if replayed:
        headers.append(("Idempotent-Replayed", "true"))
    return Response(201, body.encode(), headers)


def check_query(request: Request, allowed: frozenset[str]) -> dict[str, str]:
    """The query parameters, refusing unknown and repeated ones (400)."""
    query = request.query
    unknown = query.keys() - allowed
    if unknown:
        allowed_text = ", ".join(sorted(allowed)) if allowed else "none"
        raise BadRequest(f"unknown query parameter(s): {', '.join(sorted(unknown))}; "
                         f"allowed: {allowed_text}")
    if request.repeated_params:
        raise BadRequest(f"query parameter(s) given more than once: "
                         f"{', '.join(sorted(request.repeated_params))}")
    return query


def limit_param(query: dict[str, str], default: int | None, maximum: int) -> int | None:
    """`limit` as an integer from 1 to maximum (400 otherwise), or `default` when absent."""
    raw_limit = query.get("limit")
    if raw_limit is None:
        return default
    if not _LIMIT_RE.fullmatch(raw_limit) or not 1 <= int(raw_limit) <= maximum:
        raise BadRequest(f"limit must be an integer from 1 to {maximum}")
    return int(raw_limit)


def _upper(value: str | None) -> str | None:
    return None if value is None else value.upper()


def _body(row: tuple[Any, ...] | None) -> tuple[Any, ...]:
    if row is None or row[0] is None:
        raise SftqError("the database answered no row")
    return row


# --- the functions --------------------------------------------------------------------------

class JobsApi:
    """The route handlers. Stateless apart from the pool and a lazily built provider client."""

    def __init__(self, settings: Settings, db: dbmod.Database,
                 provider_factory: ProviderFactory | None = None) -> None:
        self.settings = settings
        self.db = db
        self.max_body = settings.max_body_bytes
        self._provider_factory = provider_factory or default_provider_factory(settings)
        self._provider: JobStopper | None = None
        self._provider_lock = threading.Lock()
        self._openapi: bytes | None = None
        self.group_commit = GroupCommit(db, default_queue_timeout=settings.queue_timeout_seconds,
                                        max_batch=settings.group_commit_max,
                                        linger=settings.group_commit_linger_ms / 1000)

    # POST /jobs, in three steps that the RSGI gateway (gateway_rsgi.py) also takes, with an
    # awaited body and group commit between them.
    def submit(self, request: Request) -> Response:
        key_hash, idem = submit_headers(request)
        params = submit_params(key_hash, idem, request.read_body(self.max_body))
        return created(request, self.group_commit.submit(params))

    # GET /jobs
    def list_jobs(self, request: Request) -> Response:
        key_hash = authenticate(request)
        query = check_query(request, _LIST_PARAMS)
        # States and kinds are case-insensitive (?state=queued), as in the client and the CLI.
        state = _upper(query.get("state"))
        if state is not None and state not in STATES:
            raise BadRequest("state must be one of " + ", ".join(STATES))
        kind = _upper(query.get("kind"))
        if kind is not None and kind not in KINDS:
            raise BadRequest("kind must be one of " + ", ".join(KINDS))
        limit = limit_param(query, None, MAX_PAGE_SIZE)
        cursor = query.get("cursor")
        if cursor is not None and not _CURSOR_RE.fullmatch(cursor):
            raise BadRequest("cursor is not valid; use the X-Next-Cursor value of the "
                             "previous page")
        id_prefix = query.get("id_prefix")
        if id_prefix is not None:
            return self._jobs_by_id_prefix(key_hash, id_prefix, state, kind,
                                           DEFAULT_PAGE_SIZE if limit is None else limit, cursor)
        if limit is None and cursor is None:
            # The contract's "all of your jobs, newest first": every job, streamed.
            from .api_listing import all_jobs

            return all_jobs(self.db, key_hash, state, kind)
        body, next_cursor = _body(self.db.fetchone(
            dbmod.API_LIST_JOBS,
            (key_hash, state, kind, DEFAULT_PAGE_SIZE if limit is None else limit, cursor)))
        headers = list(JSON_HEADERS)
        if next_cursor:
            params = {k: v for k, v in query.items() if k != "cursor"}
            params["cursor"] = next_cursor
            link = f"{request.script_name}/jobs?{urlencode(params, quote_via=quote)}"
            headers += [("X-Next-Cursor", next_cursor), ("Link", f'<{link}>; rel="next"')]
        return Response(200, body.encode(), headers)

    # GET /jobs?id_prefix=: one page of the caller's jobs whose id starts so, never paged.
    def _jobs_by_id_prefix(self, key_hash: bytes, prefix: str, state: str | None,
                           kind: str | None, limit: int, cursor: str | None) -> Response:
        if cursor is not None:
            raise BadRequest("cursor and id_prefix do not go together: an id_prefix answer "
                             "is one page")
        if not _ID_PREFIX_RE.fullmatch(prefix) or len(prefix.replace("-", "")) < 8:
            raise BadRequest("id_prefix must be 8 to 32 hexadecimal digits of a job id "
                             "(dashes allowed)")
        body = _body(self.db.fetchone(dbmod.API_JOBS_BY_ID_PREFIX,
                                      (key_hash, prefix, state, kind, limit)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))

    # GET /jobs/{id}
    def get_job(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        job_id = job_id_param(request, raw_id)
        body = _body(self.db.fetchone(dbmod.API_GET_JOB, (key_hash, job_id)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))

    # DELETE /jobs/{id}
    def cancel_job(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        job_id = job_id_param(request, raw_id)
        body, action, kind, job_name = _body(self.db.fetchone(
            dbmod.API_CANCEL_JOB, (key_hash, job_id)))
        if action == "none":
            return Response(200, body.encode(), list(JSON_HEADERS))
        if action in ("provider_delete", "provider_cancel"):
            provider_id = job_name.rsplit("/", 1)[-1] if job_name else _provider_job_id(job_id)
            if self._stop_at_provider(kind, provider_id, job_id):
                try:
                    done = _body(self.db.fetchone(dbmod.API_COMPLETE_CANCEL, (key_hash, job_id)))[0]
                except Unavailable:
                    # The stop happened and the cancel is recorded: the next tick finishes it.
                    logger.warning("cancel %s: provider stopped it, database unavailable", job_id)
                else:
                    return Response(200, done.encode(), list(JSON_HEADERS))
        # "deferred" (admitted, not yet submitted: only the scheduler may touch the provider
        # then, or a create in flight could be missed) and every provider failure land here.
        pending = body[:-1] + ', "message": ' + json.dumps(CANCEL_PENDING_MESSAGE) + "}"
        return Response(202, pending.encode(), list(JSON_HEADERS))

    def _stop_at_provider(self, kind: str, provider_id: str, job_id: str) -> bool:
        try:
            provider = self._get_provider()
            provider.stop_job(kind, provider_id)
        except Exception as exc:
            # Any failure leaves the cancel recorded; the scheduler retries it (invariant 6).
            logger.warning("cancel %s: provider stop failed (%s): %s",
                           job_id, type(exc).__name__, exc)
            return False
        return True

    def _get_provider(self) -> JobStopper:
        if self._provider is None:
            with self._provider_lock:
                if self._provider is None:
                    self._provider = self._provider_factory()
        return self._provider

    # GET /jobs/analytics/queue
    def queue_context(self, request: Request) -> Response:
        key_hash = authenticate(request)
        body = _body(self.db.fetchone(dbmod.API_QUEUE_CONTEXT_AT, (
            key_hash, self.settings.tick_interval_seconds,
            self.settings.usage_grace_seconds)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))

    # GET /jobs/analytics/summary
    def summary(self, request: Request) -> Response:
        key_hash = authenticate(request)
        body = _body(self.db.fetchone(dbmod.API_SUMMARY, (key_hash,)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))

    # GET /jobs/{id}/analytics
    def job_analytics(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        job_id = job_id_param(request, raw_id)
        body = _body(self.db.fetchone(dbmod.API_JOB_ANALYTICS_AT, (
            key_hash, job_id, self.settings.tick_interval_seconds,
            self.settings.usage_grace_seconds)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))

    # GET /health
    def health(self, request: Request) -> Response:
        # Bounded by the pool timeout (settings.db_timeout_seconds): a dead database is a 503
        # with Retry-After, never a hang; the pool reconnects by itself when it is back.
        body = _body(self.db.fetchone(dbmod.API_HEALTH))[0]
        return Response(200, ('{"status": "ok", ' + body[1:]).encode(),
                        [*JSON_HEADERS, ("Cache-Control", "no-store")])

    # GET /openapi.json
    def openapi(self, request: Request) -> Response:
        if self._openapi is None:
            try:
                self._openapi = OPENAPI_PATH.read_bytes()
            except OSError:
                raise NotFound("the OpenAPI document is not deployed with this function") from None
        return Response(200, self._openapi, list(JSON_HEADERS))

    def close(self) -> None:
        provider, self._provider = self._provider, None
        close = getattr(provider, "close", None)
        if callable(close):
            close()


def _provider_job_id(job_id: str) -> str:
    from .provider import provider_job_id

    return provider_job_id(job_id)


def _database(settings: Settings, url: str) -> dbmod.Database:
    if not url:
        raise ValueError("no database URL: set DATABASE_URL")
    return dbmod.get_database(url, max_size=settings.db_pool_max,
                              timeout=settings.db_timeout_seconds)


class ApiApp(App):
    """An App that also owns the JobsApi behind it (for close())."""

    def __init__(self, router: Router, api: JobsApi, *, name: str, mount_prefix: str) -> None:
        super().__init__(router, name=name, mount_prefix=mount_prefix)
        self.api = api

    def close(self) -> None:
        self.api.close()
        self.api.db.close()


def make_jobs_api(settings: Settings, *, db: dbmod.Database | None = None,
                  provider_factory: ProviderFactory | None = None) -> ApiApp:
    """The jobs-api handler (Request -> Response): every route of the contract."""
    api = JobsApi(settings, db or _database(settings, settings.database_url), provider_factory)
    router = Router()
    router.add("POST", "/jobs", api.submit)
    router.add("GET", "/jobs", api.list_jobs)
    # Static analytics paths are matched before /jobs/{id}/... templates (see Router).
    router.add("GET", "/jobs/analytics/queue", api.queue_context)
    router.add("GET", "/jobs/analytics/summary", api.summary)
    router.add("GET", "/jobs/{id}", api.get_job)
    router.add("DELETE", "/jobs/{id}", api.cancel_job)
    router.add("GET", "/jobs/{id}/analytics", api.job_analytics)
    router.add("POST", "/jobs/{id}/retry", functools.partial(retry_job, api))
    router.add("GET", "/health", api.health)
    router.add("GET", "/openapi.json", api.openapi)
    # The live stream is served by an async server (functions/jobs_stream.py, the gateway);
    # here the two paths answer 501 so that clients poll instead.
    router.add("GET", "/jobs/stream", stream_unavailable)
    router.add("GET", "/jobs/{id}/stream", stream_unavailable)
    # Visibility (history and capacity): handlers in modules of their own.
    from .api_capacity import CapacityApi
    from .api_events import EventsApi

    router.add("GET", "/jobs/{id}/events", EventsApi(api.db).list_events)
    router.add("GET", "/capacity", CapacityApi(settings, api.db).capacity)
    from .api_webhooks import register as register_webhooks  # webhooks (docs/webhooks.md)

    register_webhooks(router, settings, api.db)
    # The web dashboard: its page and files, and the read-only routes it reads.
    from .api_dashboard import add_routes as add_dashboard_routes

    add_dashboard_routes(router, settings, api.db)
    return ApiApp(router, api, name="jobs-api", mount_prefix="/functions/v1/jobs-api")


def make_analytics_api(settings: Settings, *, db: dbmod.Database | None = None) -> ApiApp:
    """The read-only analytics handler; it may point at a replica (ANALYTICS_DATABASE_URL)."""
    api = JobsApi(settings, db or _database(settings, analytics_database_url(settings)))
    router = Router()
    router.add("GET", "/jobs/analytics/queue", api.queue_context)
    router.add("GET", "/jobs/analytics/summary", api.summary)
    router.add("GET", "/jobs/{id}/analytics", api.job_analytics)
    router.add("GET", "/health", api.health)
    return ApiApp(router, api, name="analytics", mount_prefix="/functions/v1/analytics")
