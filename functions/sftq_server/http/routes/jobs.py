"""The jobs routes: submit, list, get, cancel and retry one's own jobs.

Each request costs one database round trip (two for a cancel the provider confirms). The
procedures (sql/procedures/100_api.sql) authenticate the key hash and answer the response body
as JSON text; nothing here re-parses or re-shapes it. Python only refuses what it can refuse
without the database (http/checks.py): a malformed key, an invalid body or query, a path id that
is not a UUID.

GET /jobs without `limit` or `cursor` is the contract's "all of your jobs": a heavy user has tens
of thousands, so that answer is never built whole. It is read in keyset pages of STREAM_PAGE jobs
(sftq.api_list_jobs, the same procedure as the paged form) and written page by page as one JSON
array. Each page is its own short query: no database connection is held while the client reads,
which a transaction-mode pooler and a slow client both need. Jobs appear once each, newest first
(the keyset is (created_at, id), which never changes); the pages are not one snapshot, like pages
a client would fetch itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from pydantic import ValidationError

from sftq_server import db as dbmod
from sftq_server.core.errors import BadRequest, SftqError, Unavailable
from sftq_server.core.settings import Settings
from sftq_server.http.checks import (
    authenticate,
    check_json_content_type,
    check_query,
    idempotency_key,
    job_id_param,
    limit_param,
    one_row,
    upper,
)
from sftq_server.http.group_commit import Answer, GroupCommit, Params
from sftq_server.http.models import (
    DEFAULT_PAGE_SIZE,
    KINDS,
    MAX_AFTER,
    MAX_DISPLAY_NAME,
    MAX_GPU_COUNT,
    MAX_PAGE_SIZE,
    MAX_QUEUE_TIMEOUT,
    MAX_RUN_SECONDS,
    MIN_RUN_SECONDS,
    STATES,
    SUBMIT_FIELDS,
    SubmitRequest,
    upper_ascii,
)
from sftq_server.http.web import JSON_HEADERS, Request, Response
from sftq_server.preflight import Finding, ShapeReport, check_shape, findings_json
from sftq_server.preflight.schema import schema_version

logger = logging.getLogger("sftq.api")

_CURSOR_RE = re.compile(r"[0-9]{1,17}_[0-9a-f]{32}")
_LIST_PARAMS = frozenset({"state", "kind", "limit", "cursor", "id_prefix"})
_ID_PREFIX_RE = re.compile(r"[0-9a-fA-F-]{8,36}")

CANCEL_PENDING_MESSAGE = "cancel recorded; the scheduler will finish it at its next tick"


class JobStopper(Protocol):
    """What a cancel needs from the provider client (sftq_server.provider.FireworksClient)."""

    def stop_job(self, kind: str, job_id: str) -> str: ...


ProviderFactory = Callable[[], JobStopper]


def default_provider_factory(settings: Settings,
                             db: dbmod.Database | None = None) -> ProviderFactory:
    def build() -> JobStopper:
        # Imported here: httpx and the client load only when the provider is first asked.
        from sftq_server.budget import DbBudget
        from sftq_server.provider import FireworksClient

        return FireworksClient(
            base_url=settings.fireworks_base_url,
            api_key=settings.fireworks_api_key,
            account_id=settings.fireworks_account_id,
            quota_id=settings.fireworks_quota_id,
            timeout=settings.fireworks_timeout_seconds,
            rpm=settings.fireworks_rpm,
            # The deployment's one budget: a cancel's stop by default; each request's lookups
            # say whose they are (JobsApi._ask_provider).
            budget=DbBudget(db, settings, "cancel") if db is not None else None,
        )

    return build


# The header the MCP endpoint's in-process transport sets on its jobs-api calls
# (sftq_server.http.mcp.InProcessTransport): their provider calls count as source "mcp". It
# names a metrics label only; the budget is the same whichever source a user's lookup has.
SOURCE_HEADER = "x-sftq-source"


def lookup_source(request: Request, default: str) -> str:
    return "mcp" if request.headers.get(SOURCE_HEADER) == "mcp" else default


BUDGET_SPENT_WARNING = (
    "pre-flight lookups skipped: the provider budget for lookups is spent for now (your share "
    "of FIREWORKS_RPM, or the share left outside the tick's reserve); the job is accepted and "
    "the scheduler checks its dataset, evaluator and models while it waits")


_FIELD_MESSAGES = {
    "kind": "kind must be one of " + ", ".join(KINDS),
    "fireworks_payload": "fireworks_payload must be a JSON object",
    "gpu_count": f"gpu_count must be an integer from 1 to {MAX_GPU_COUNT}",
    "display_name": f"display_name must be a string of at most {MAX_DISPLAY_NAME} characters",
    "queue_timeout_seconds": f"queue_timeout_seconds must be an integer from 1 to "
                             f"{MAX_QUEUE_TIMEOUT} (30 days)",
    "validate": 'validate must be "on" (the default) or "off" (skip the pre-flight check)',
    "after": f"after must be a list of at most {MAX_AFTER} of your job ids (full ids or their "
             f"first 8 to 32 hexadecimal digits)",
    "max_run_seconds": f"max_run_seconds must be an integer from {MIN_RUN_SECONDS} to "
                       f"{MAX_RUN_SECONDS} (30 days)",
}


def parse_submit(body: bytes, check: bool = True) -> tuple[SubmitRequest, str]:
    """Validate a POST /jobs body; answer the request and fireworks_payload as JSON text.
    A body with field problems answers them all at once: with `check` (the pre-flight on), the
    400 also lists the definite problems the shape check finds in its fireworks_payload."""
    try:
        req = SubmitRequest.model_validate_json(body)
    except ValidationError as exc:
        raise _submit_error(exc, body if check else None) from None
    if req.after is not None and len(req.after) > MAX_AFTER:
        raise BadRequest(f"after names {len(req.after)} jobs; at most {MAX_AFTER} are allowed",
                         code="too_many_dependencies")
    try:
        payload = json.dumps(req.fireworks_payload, ensure_ascii=False, allow_nan=False,
                             separators=(",", ":"))
    except ValueError:
        raise BadRequest("request body is not valid JSON: NaN, Infinity and out-of-range numbers "
                         "are not allowed", code="invalid_json") from None
    # PostgreSQL text and jsonb cannot hold U+0000; only a body that spells it needs the walk.
    if b"\\u0000" in body and (_has_nul(req.fireworks_payload) or _has_nul(req.after)
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


def _submit_error(exc: ValidationError, body: bytes | None = None) -> SftqError:
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
            # `path` as the pre-flight's findings name where (issue 54.13); `field` stays.
            details.append({"field": field, "path": field, "message": message})
    if body is not None:
        details.extend(_payload_problems(body, {d["field"] for d in details}))
    return BadRequest("; ".join(d["message"] for d in details), detail=details)


def _payload_problems(body: bytes, bad_fields: set[str]) -> list[dict[str, str]]:
    """The shape check's definite findings in a body whose other fields are wrong, so that one
    answer names every problem: only when the kind and the payload are themselves well-formed
    (the check needs both) and the body does not turn the check off."""
    if bad_fields & {"kind", "fireworks_payload", "validate"}:
        return []
    try:
        data = json.loads(body)
    except ValueError:
        return []
    kind = upper_ascii(data.get("kind")) if isinstance(data, dict) else None
    payload = data.get("fireworks_payload") if isinstance(data, dict) else None
    if kind not in KINDS or not isinstance(payload, dict) or data.get("validate", "on") != "on":
        return []
    return [{"field": "fireworks_payload", **f.as_json()}
            for f in check_shape(str(kind), payload).errors]


def default_display_name(payload: dict[str, Any]) -> str | None:
    """The name a job gets when the request gives none: the payload's own `displayName` (the
    name Fireworks shows), cut to the display-name limit; None when it has none."""
    name = payload.get("displayName")
    if not isinstance(name, str) or not name.strip():
        return None
    return name[:MAX_DISPLAY_NAME]


def submit_headers(request: Request) -> tuple[bytes, str | None]:
    """POST /jobs before its body is read: the key's hash and the Idempotency-Key."""
    key_hash = authenticate(request)
    check_json_content_type(request)
    return key_hash, idempotency_key(request)


def preflight(req: SubmitRequest, enabled: bool = True) -> ShapeReport:
    """The pre-flight shape check of a parsed POST /jobs body: a definite error is the 400
    `invalid_fireworks_payload` (each finding's path and what to fix); the doubtful findings
    are the caller's to report."""
    if not enabled or req.validate_ == "off":
        return ShapeReport()
    report = check_shape(req.kind, req.fireworks_payload)
    if report.errors:
        raise payload_refusal(report.errors)
    return report


@dataclass
class Preflight:
    """What the pre-flight of one POST /jobs found, for its 201 and the job record.

    outcome: "skipped" (off for this request), "pending" (the provider not asked here, or not
    answering within the budget: the tick asks), "checked" (the provider answered every
    check); None when pre-flight is off for the deployment."""

    req: SubmitRequest
    warnings: list[Finding] = field(default_factory=list)
    estimated_cost: Any = None
    outcome: str | None = None
    # Whose lookups these are, for the provider budget: the key's hash and the source label.
    user: bytes = b""
    source: str = "preflight"

    @property
    def to_record(self) -> bool:
        """Whether the job record gains anything from it (else no round trip is spent)."""
        if self.outcome is None:
            return False
        return self.outcome != "pending" or bool(self.warnings) or self.estimated_cost is not None


def submit_params(key_hash: bytes, idem: str | None, body: bytes,
                  check: bool = True, source: str = "preflight") -> tuple[Params, Preflight]:
    """POST /jobs: what the group commit takes, from the checked headers and the body, and
    the pre-flight shape check's findings (its definite errors are the 400)."""
    req, payload = parse_submit(body, check)
    report = preflight(req, check)
    outcome = None if not check else "skipped" if req.validate_ == "off" else "pending"
    name = req.display_name
    if name is None:
        name = default_display_name(req.fireworks_payload)
    return (key_hash, req.kind, payload, name, req.gpu_count, idem,
            req.queue_timeout_seconds), Preflight(req, report.warnings, outcome=outcome,
                                                  user=key_hash, source=source)


def is_direct(pre: Preflight) -> bool:
    """Whether POST /jobs goes around the group commit: a request with "after" or
    "max_run_seconds" (issue 53) is enqueued alone by sftq.api_submit_job, so a plain one
    pays nothing for them."""
    return pre.req.after is not None or pre.req.max_run_seconds is not None


def submit_direct(db: dbmod.Database, params: Params, pre: Preflight,
                  default_queue_timeout: int | None) -> Answer:
    """POST /jobs with "after" or "max_run_seconds": one call of sftq.api_submit_job."""
    key_hash, kind, payload, name, gpus, idem, timeout = params
    body, replayed, job_id = one_row(db.fetchone(
        dbmod.API_SUBMIT_JOB, (key_hash, kind, payload, name, gpus, idem, timeout,
                               default_queue_timeout, pre.req.after, pre.req.max_run_seconds)))
    return body, bool(replayed), str(job_id)


def created(request: Request, answer: Answer, pre: Preflight | None = None) -> Response:
    """POST /jobs: the 201 for the group commit's answer."""
    body, replayed, job_id = answer
    request.job_id = job_id
    headers = [*JSON_HEADERS, ("Location", f"{request.script_name}/jobs/{job_id}")]
    if replayed:
        headers.append(("Idempotent-Replayed", "true"))
    if pre is not None and (found := findings_json(pre.warnings)) is not None:
        # The procedure's body is one JSON object; the warnings join it as its last field.
        body = f'{body[:-1]},"warnings":{found}}}'
    if pre is not None and pre.estimated_cost is not None:
        cost = json.dumps(pre.estimated_cost, ensure_ascii=False)
        body = f'{body[:-1]},"estimated_cost":{cost}}}'
    return Response(201, body.encode(), headers)


def payload_refusal(errors: list[Finding]) -> BadRequest:
    """The 400 for definite pre-flight findings, from the shape or the provider check."""
    return BadRequest("fireworks_payload would fail at Fireworks: "
                      + "; ".join(f.message for f in errors),
                      code="invalid_fireworks_payload", detail=[f.as_json() for f in errors])


# --- the functions --------------------------------------------------------------------------

class JobsApi:
    """The route handlers. Stateless apart from the pool and a lazily built provider client."""

    def __init__(self, settings: Settings, db: dbmod.Database,
                 provider_factory: ProviderFactory | None = None) -> None:
        self.settings = settings
        self.db = db
        self.max_body = settings.max_body_bytes
        self._provider_factory = provider_factory or default_provider_factory(settings, db)
        self._provider: JobStopper | None = None
        self._provider_lock = threading.Lock()
        self.group_commit = GroupCommit(db, default_queue_timeout=settings.queue_timeout_seconds,
                                        max_batch=settings.group_commit_max,
                                        linger=settings.group_commit_linger_ms / 1000)

    # POST /jobs, in three steps that the RSGI gateway (gateway_rsgi.py) also takes, with an
    # awaited body and group commit between them.
    def submit(self, request: Request) -> Response:
        key_hash, idem = submit_headers(request)
        params, pre = submit_params(key_hash, idem, request.read_body(self.max_body),
                                    self.settings.preflight, lookup_source(request, "preflight"))
        self.check_resources(pre)
        answer = self.submit_direct(params, pre) if is_direct(pre) else \
            self.group_commit.submit(params)
        self.record_preflight(key_hash, answer, pre)
        return created(request, answer, pre)

    def submit_direct(self, params: Params, pre: Preflight) -> Answer:
        return submit_direct(self.db, params, pre, self.settings.queue_timeout_seconds)

    # -- pre-flight at the provider (sftq_server.preflight.resources) ---------------------

    def can_ask_provider(self) -> bool:
        s = self.settings
        return bool(s.fireworks_api_key and s.fireworks_account_id and s.preflight_budget_ms > 0)

    def check_resources(self, pre: Preflight) -> None:
        """Ask Fireworks about the resources the payload names, within the budget: a missing
        one is the 400; what is doubtful joins the warnings. Blocks for the budget at most
        (the RSGI gateway runs it on a worker thread)."""
        if pre.outcome != "pending" or not self.can_ask_provider():
            return

        report = self._ask_provider(pre.req, source=pre.source, user=pre.user)
        if report is None:
            return  # left to the tick
        if report.errors:
            raise payload_refusal(report.errors)
        pre.warnings.extend(report.warnings)
        if report.budget_spent:
            pre.warnings.append(Finding("fireworks_payload", BUDGET_SPENT_WARNING))
        pre.estimated_cost = report.estimated_cost
        # Not answered in time: left to the next tick, as if never asked.
        pre.outcome = "checked" if report.answered else "pending"

    def _ask_provider(self, req: SubmitRequest, estimate: bool = True, *,
                      source: str = "preflight", user: bytes = b"") -> Any:
        """The provider check's report, or None when it could not be made at all (an
        unexpected failure is logged and leaves the check to the tick: never a 500). Its
        calls draw on the caller's share of the deployment's provider budget."""
        from sftq_server.preflight.resources import check_resources

        try:
            provider: Any = self._get_provider()
            acting = getattr(getattr(provider, "budget", None), "acting_for", None)
            with acting(source, user) if acting is not None else contextlib.nullcontext():
                return check_resources(provider, req.kind, req.fireworks_payload,
                                       req.gpu_count,
                                       budget_seconds=self.settings.preflight_budget_ms / 1000,
                                       estimate=estimate)
        except Exception as exc:  # noqa: BLE001 - the job is checked again by the tick
            logger.warning("pre-flight provider check failed (%s): %s", type(exc).__name__, exc)
            return None

    def record_preflight(self, key_hash: bytes, answer: Answer, pre: Preflight) -> None:
        """Keep on the new job what its pre-flight learned. Nothing to write (the common case
        without Fireworks credentials here: the tick checks it) costs no round trip; a failure
        here loses no job, only what the 201 already said."""
        _, replayed, job_id = answer
        if replayed or not pre.to_record:
            return
        cost = json.dumps(pre.estimated_cost) if pre.estimated_cost is not None else None
        try:
            self.db.scalar(dbmod.API_RECORD_PREFLIGHT,
                           (key_hash, job_id, pre.outcome, findings_json(pre.warnings), cost))
        except SftqError as exc:
            logger.warning("job %s: could not record its pre-flight: %s", job_id, exc.message)

    # POST /jobs:validate: the same body as POST /jobs, every check, nothing enqueued.
    def validate(self, request: Request) -> Response:
        key_hash = authenticate(request)
        check_json_content_type(request)
        req, _ = parse_submit(request.read_body(self.max_body))
        # The key checked and one request counted against the caller's rate (429
        # rate_limited over it) before any provider lookup: a loop of validates cannot
        # spend what the other users and the tick need.
        self.db.scalar(dbmod.API_RATE_TAKE, (key_hash,))
        report = check_shape(req.kind, req.fireworks_payload)
        errors, warnings = list(report.errors), list(report.warnings)
        cost: Any = None
        # "unavailable": no Fireworks credentials here; "unanswered": not in the time budget
        # or not in the request budget; "skipped": the shape check already found a definite
        # error, and a payload Fireworks would refuse is not worth the account's requests.
        checked = "unavailable"
        if errors and self.can_ask_provider():
            checked = "skipped"
        elif self.can_ask_provider():
            found = self._ask_provider(req, source=lookup_source(request, "validate"),
                                       user=key_hash)
            checked = "done" if found is not None and found.answered else "unanswered"
            if found is not None:
                errors += found.errors
                warnings += found.warnings
                cost = found.estimated_cost
                if found.budget_spent:
                    warnings.append(Finding("fireworks_payload", BUDGET_SPENT_WARNING))
        body = {"valid": not errors, "kind": req.kind,
                "errors": [f.as_json() for f in errors],
                "warnings": [f.as_json() for f in warnings],
                "schema_version": f"fireworks-ai {schema_version()}",
                "provider_checks": checked, "estimated_cost": cost}
        return Response(200, json.dumps(body, ensure_ascii=False).encode(), list(JSON_HEADERS))

    # GET /jobs
    def list_jobs(self, request: Request) -> Response:
        key_hash = authenticate(request)
        query = check_query(request, _LIST_PARAMS)
        # States and kinds are case-insensitive (?state=queued), as in the client and the CLI.
        state = upper(query.get("state"))
        if state is not None and state not in STATES:
            raise BadRequest("state must be one of " + ", ".join(STATES))
        kind = upper(query.get("kind"))
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
            return all_jobs(self.db, key_hash, state, kind)
        body, next_cursor = one_row(self.db.fetchone(
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
        body = one_row(self.db.fetchone(dbmod.API_JOBS_BY_ID_PREFIX,
                                      (key_hash, prefix, state, kind, limit)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))

    # GET /jobs/{id}
    def get_job(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        job_id = job_id_param(request, raw_id)
        body = one_row(self.db.fetchone(dbmod.API_GET_JOB, (key_hash, job_id)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))

    # DELETE /jobs/{id}
    def cancel_job(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        job_id = job_id_param(request, raw_id)
        body, action, kind, job_name = one_row(self.db.fetchone(
            dbmod.API_CANCEL_JOB, (key_hash, job_id)))
        if action == "none":
            return Response(200, body.encode(), list(JSON_HEADERS))
        if action in ("provider_delete", "provider_cancel"):
            provider_id = job_name.rsplit("/", 1)[-1] if job_name else _provider_job_id(job_id)
            if self._stop_at_provider(kind, provider_id, job_id):
                try:
                    done = one_row(self.db.fetchone(dbmod.API_COMPLETE_CANCEL,
                                                    (key_hash, job_id)))[0]
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
        provider: Any = None
        try:
            provider = self._get_provider()
            provider.stop_job(kind, provider_id)
        except Exception as exc:
            # Any failure leaves the cancel recorded; the scheduler retries it (invariant 6).
            logger.warning("cancel %s: provider stop failed (%s): %s",
                           job_id, type(exc).__name__, exc)
            return False
        finally:
            # The stop's count (sftq_provider_requests_total{source="cancel"}).
            flush = getattr(getattr(provider, "budget", None), "flush", None)
            if flush is not None:
                try:
                    flush()
                except Exception as exc:  # noqa: BLE001 - a metric lost, never the cancel
                    logger.warning("cancel %s: could not record the provider call: %s",
                                   job_id, exc)
        return True

    def _get_provider(self) -> JobStopper:
        if self._provider is None:
            with self._provider_lock:
                if self._provider is None:
                    self._provider = self._provider_factory()
        return self._provider

    # POST /jobs/{id}/retry: a FAIL or CANCELLED job enqueued again as a new job. One procedure
    # call (sftq.api_retry_job) checks the job is the caller's and has ended badly, and answers
    # the enqueue shape plus retry_of.
    def retry(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        job_id = job_id_param(request, raw_id)
        idem = idempotency_key(request)
        # The body, if any, is not read: a retry takes everything from the old job.
        body, replayed, new_id = one_row(self.db.fetchone(
            dbmod.API_RETRY_JOB, (key_hash, job_id, idem, self.settings.queue_timeout_seconds)))
        new_id = str(new_id)
        headers = [*JSON_HEADERS, ("Location", f"{request.script_name}/jobs/{new_id}")]
        if replayed:
            headers.append(("Idempotent-Replayed", "true"))
        return Response(201, body.encode(), headers)

    def close(self) -> None:
        provider, self._provider = self._provider, None
        close = getattr(provider, "close", None)
        if callable(close):
            close()


def _provider_job_id(job_id: str) -> str:
    from sftq_server.provider import provider_job_id

    return provider_job_id(job_id)


# Jobs per page read from the database (the procedure's maximum page size).
STREAM_PAGE = 1000


def all_jobs(db: dbmod.Database, key_hash: bytes, state: str | None,
             kind: str | None) -> Response:
    """The whole list. The first page is read before answering, so a bad key or a database
    that is down is still a proper error status; most callers fit in it and get a plain body."""
    body, cursor = one_row(db.fetchone(dbmod.API_LIST_JOBS,
                                       (key_hash, state, kind, STREAM_PAGE, None)))
    if not cursor:
        return Response(200, body.encode(), list(JSON_HEADERS))
    return Response(200, headers=list(JSON_HEADERS),
                    stream=_pages(db, key_hash, state, kind, body, cursor))


def _pages(db: dbmod.Database, key_hash: bytes, state: str | None, kind: str | None,
           first: str, cursor: str | None) -> Iterator[bytes]:
    # Each page is the procedure's JSON array text: its items go out between our own
    # brackets, so nothing is parsed or re-encoded here.
    yield first[:-1].encode()
    while cursor:
        try:
            page, cursor = one_row(db.fetchone(dbmod.API_LIST_JOBS,
                                               (key_hash, state, kind, STREAM_PAGE, cursor)))
        except Exception:
            # The status is sent already: end the response unfinished (no closing bracket,
            # no final chunk) so the client cannot mistake it for a complete list.
            logger.exception("GET /jobs: the database failed while streaming the list")
            raise
        items = page[1:-1]
        if items.strip():
            yield b", " + items.encode()
    yield b"]"
