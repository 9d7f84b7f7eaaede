"""The classes of provider failure the scheduler acts on, and the parsing of error answers
(error bodies in their several shapes, google.rpc codes, Retry-After)."""

from __future__ import annotations

import email.utils
import json
import math
import time
from datetime import UTC
from http import HTTPStatus

# google.rpc codes by number, for error bodies that carry the code as an int.
_RPC_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}



class ProviderError(Exception):
    """A Fireworks call failed. `body` is the raw response text (empty when there was none)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str = "",
        provider_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        # The human message parsed out of the body, whichever of the error shapes it used.
        self.provider_message = provider_message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, message={str(self)!r})"


class Rejected(ProviderError):
    """Fireworks refused the request itself (a 4xx that retrying cannot fix).

    On create this means the payload was rejected: the job goes to FAIL with `body` verbatim.
    """


class AuthError(Rejected):
    """401 or 403: our key or account is wrong, not the job's payload.

    A subclass of `Rejected` so callers that only know `Rejected` stay correct; a scheduler
    may prefer to keep jobs queued and raise an alarm instead of failing every job.
    """


class AlreadyExists(ProviderError):
    """409 ALREADY_EXISTS: a job with this id exists already (the create was a retry); adopt
    it with a GET. Any other 409 (google.rpc ABORTED, or one we cannot read) is `Transient`."""


class NotFound(ProviderError):
    """404 on get, delete, cancel, list or quota: the resource is not there (or was deleted)."""


class Transient(ProviderError):
    """Connection error, timeout, 408, 429 or 5xx: try again later.

    `retry_after` is the server's Retry-After in seconds when it sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str = "",
        provider_message: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status=status, body=body, provider_message=provider_message)
        self.retry_after = retry_after


class RateLimited(Transient):
    """429 RESOURCE_EXHAUSTED: over the account's request rate (or, on a create, over the
    quota: `quota_exceeded`). Never a failure of the job it concerned. Also raised without
    sending anything for a call made while an earlier 429's Retry-After is still running
    (`status` is then None)."""



class BudgetSpent(RateLimited):
    """Not sent: the deployment's provider budget (FIREWORKS_RPM, shared by every process)
    has no slot for this caller now: the lookup share or this user's share of it is spent,
    or the tick's reserve. Never a 429 from the provider (`status` None, no Retry-After), so
    it holds nobody; pre-flight leaves the check to the tick."""


def rpc_name(code: object) -> str | None:
    """A google.rpc code as its name, from a name or a number (both are seen in JSON)."""
    if isinstance(code, bool):
        return None
    if isinstance(code, int):
        return _RPC_NAMES.get(code)
    if isinstance(code, str) and code.strip():
        text = code.strip().upper()
        return _RPC_NAMES.get(int(text)) if text.isdigit() else text
    return None



def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def parse_error_code(text: str) -> str | None:
    """The google.rpc code name in an error body (`{"code": 6}`, `{"code": "ALREADY_EXISTS"}`,
    `{"error": {"status": "ALREADY_EXISTS"}}`, ...), or None when it names none."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    for holder in (error if isinstance(error, dict) else {}, data):
        for key in ("status", "code"):
            name = rpc_name(holder.get(key))
            if name is not None and name in _RPC_NAMES.values():
                return name
    return None


def parse_error_message(text: str) -> str | None:
    """The message in an error body, from any of the shapes Fireworks is seen to use.

    Shapes (unconfirmed which one each endpoint uses, so all are accepted):
    {"code": 3, "message": "..."} (grpc-gateway), {"error": {"message": "..."}},
    {"error": "..."} and {"message": "..."}.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(data.get("message"), str):
        return str(data["message"])
    if isinstance(error, str):
        return error
    return None



def http_reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "unexpected status"
