"""Typed errors: SQLSTATE codes from the procedures become these exceptions (from_db_error),
and these exceptions become HTTP responses (the web layer's to_http)."""

from __future__ import annotations

import json
from typing import Any


class SftqError(Exception):
    """An error with an HTTP status and a machine code, listed in docs/errors.md."""

    status = 500
    code = "internal"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        detail: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.detail = detail
        self.headers = headers or {}


class BadRequest(SftqError):
    status, code = 400, "validation_error"


class Unauthorized(SftqError):
    status, code = 401, "unauthorized"


class Forbidden(SftqError):
    status, code = 403, "forbidden"


class NotFound(SftqError):
    status, code = 404, "not_found"


class MethodNotAllowed(SftqError):
    status, code = 405, "method_not_allowed"


class Conflict(SftqError):
    status, code = 409, "conflict"


class PayloadTooLarge(SftqError):
    status, code = 413, "payload_too_large"


class UnsupportedMediaType(SftqError):
    status, code = 415, "unsupported_media_type"


class TooManyRequests(SftqError):
    """A per-user limit (sql/procedures/195_user_limits.sql): `rate_limited`, `queue_limit`
    or `too_many_streams`. The detail the procedure gave becomes the headers: Retry-After
    when waiting helps, and for the rate the IETF httpapi draft's RateLimit-Policy and
    RateLimit (docs/api.md, Limits)."""

    status, code = 429, "rate_limited"

    def __init__(self, message: str, *, code: str | None = None, detail: Any = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message, code=code, detail=detail, headers=headers)
        if isinstance(detail, dict):
            self.headers = {**limit_headers(detail), **self.headers}


def limit_headers(detail: dict[str, Any]) -> dict[str, str]:
    """Retry-After, RateLimit-Policy and RateLimit from a limit's detail (what is in it)."""
    headers: dict[str, str] = {}
    if isinstance(detail.get("retry_after"), int):
        headers["Retry-After"] = str(detail["retry_after"])
    if all(isinstance(detail.get(k), int) for k in ("limit", "window", "remaining", "reset")):
        headers["RateLimit-Policy"] = f'"default";q={detail["limit"]};w={detail["window"]}'
        headers["RateLimit"] = f'"default";r={detail["remaining"]};t={detail["reset"]}'
    return headers


class Unavailable(SftqError):
    status, code = 503, "unavailable"


# SQLSTATE raised by sql/procedures -> (exception class, machine code).
_SQLSTATE: dict[str, tuple[type[SftqError], str]] = {
    "SQ400": (BadRequest, "validation_error"),
    "SQ401": (Unauthorized, "unauthorized"),
    "SQ404": (NotFound, "not_found"),
    "SQ409": (Conflict, "job_terminal"),
    "SQ419": (Conflict, "idempotency_conflict"),
    "SQ422": (Conflict, "illegal_transition"),
    "SQ423": (Conflict, "already_exists"),
    "SQ440": (BadRequest, "too_many_webhooks"),
    "SQ441": (Conflict, "webhook_disabled"),
    # POST /jobs/{id}/retry on a job that is QUEUED, PROGRESS or SUCCESS (issue 10).
    "SQ439": (Conflict, "job_not_retryable"),
    # POST /jobs "after" (issue 53): a job that is not one of the caller's (another user's
    # answers the same), a cycle, a dependency that already ended FAIL or CANCELLED, too many.
    "SQ460": (BadRequest, "unknown_dependency"),
    "SQ461": (BadRequest, "dependency_cycle"),
    "SQ462": (BadRequest, "dependency_ended"),
    "SQ463": (BadRequest, "too_many_dependencies"),
    # The per-user limits (issue 52, sql/procedures/195_user_limits.sql).
    "SQ429": (TooManyRequests, "rate_limited"),
    "SQ4QL": (TooManyRequests, "queue_limit"),
    "SQ4SL": (TooManyRequests, "too_many_streams"),
}


def from_db_error(exc: Exception) -> SftqError | None:
    """Map a psycopg error raised by a procedure to a typed error; None if it is not ours."""
    diag = getattr(exc, "diag", None)
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate not in _SQLSTATE or diag is None:
        return None
    return from_sqlstate(sqlstate, diag.message_primary, diag.message_detail)


def from_sqlstate(sqlstate: str, message: str | None, detail_text: str | None) -> SftqError:
    """A procedure's coded error given as values (a batch answers each request's error as a
    row instead of raising it), typed exactly as the raised one would be."""
    cls, code = _SQLSTATE.get(sqlstate, (SftqError, "internal"))
    detail: Any = None
    if detail_text:
        try:
            detail = json.loads(detail_text)
        except ValueError:
            detail = detail_text
    return cls(message or code, code=code, detail=detail)
