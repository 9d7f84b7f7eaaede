"""Typed errors raised by the sftq client.

Every error the client raises is an :class:`SftqError`, so ``except SftqError`` is enough for
callers that do not care why. The subclasses let callers branch on the kind of failure without
parsing text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import Job

__all__ = [
    "APIConnectionError",
    "AmbiguousJobId",
    "BadRequest",
    "ConfigurationError",
    "Conflict",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "ServerError",
    "ServiceUnavailable",
    "SftqError",
    "Timeout",
    "MissingSetting",
    "Unauthorized",
    "WaitTimeout",
]


class SftqError(Exception):
    """Base of every error the client raises.

    ``status`` is the HTTP status (None when no response arrived), ``code`` the server's machine
    code from the error envelope (``{"error", "code", "details"}``), ``body`` the decoded response
    body (JSON when it parsed, else text), ``retry_after`` the server's ``Retry-After`` in seconds
    if it sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.body = body
        self.retry_after = retry_after
        # How many HTTP attempts the call made (retries included); 0 when none completed.
        self.attempts = 0

    @property
    def details(self) -> Any:
        """The envelope's optional ``details`` field (None when absent)."""
        if isinstance(self.body, dict):
            return self.body.get("details")
        return None

    def __str__(self) -> str:
        if self.status is None:
            return self.message
        suffix = f"{self.status} {self.code}" if self.code else str(self.status)
        return f"{self.message} ({suffix})"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(message={self.message!r}, status={self.status!r}, "
            f"code={self.code!r})"
        )


@dataclass(frozen=True)
class MissingSetting:
    """One setting the client could not find, and every way of giving it."""

    what: str  # "API key"
    argument: str  # the constructor's keyword, "api_key"
    option: str  # the CLI's option, "--api-key"
    environment: tuple[str, ...]  # environment variables, in order of preference
    note: str = ""  # how an alternative variable is used, if it needs saying

    def ways(self, via: str) -> str:
        """'--api-key or SFTQ_API_KEY' (via="cli") or 'api_key= or SFTQ_API_KEY' (via="python")."""
        first = self.option if via == "cli" else f"{self.argument}="
        text = " or ".join((first, *self.environment))
        return f"{text} ({self.note})" if self.note else text


class ConfigurationError(SftqError):
    """No API key or no base URL could be found (argument or environment), or the base URL
    does not lead to the jobs-api. ``missing`` lists every setting that was not found."""

    def __init__(self, message: str, *, missing: tuple[MissingSetting, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


class BadRequest(SftqError):
    """400 (and 415/422): the server rejected the request as malformed or invalid."""


class Unauthorized(SftqError):
    """401 (or 403): the API key is missing, wrong or revoked."""


class NotFound(SftqError):
    """404: the job does not exist *or belongs to someone else* (the server does not say which)."""


class Conflict(SftqError):
    """409: e.g. cancelling a job that is already terminal, or reusing an Idempotency-Key."""


class PayloadTooLarge(SftqError):
    """413: the request body is over the server's limit."""


class RateLimited(SftqError):
    """429 after the client ran out of retries."""


class ServerError(SftqError):
    """5xx after the client ran out of retries (or 501, which is never retried)."""


class ServiceUnavailable(ServerError):
    """503 after the client ran out of retries; ``retry_after`` says when to come back."""


class APIConnectionError(SftqError):
    """No HTTP response at all: DNS, refused connection, TLS, dropped connection."""


class Timeout(APIConnectionError):
    """The request timed out (connect, read, write or pool) after the client ran out of retries."""


class AmbiguousJobId(SftqError):
    """A job id prefix that matches more than one of your jobs; ``candidates`` are those jobs
    (up to the few the server was asked for)."""

    def __init__(self, prefix: str, candidates: list[Job]) -> None:
        super().__init__(
            f"{prefix} is the start of {len(candidates)} of your jobs' ids; give more characters"
        )
        self.prefix = prefix
        self.candidates = candidates


class WaitTimeout(SftqError, TimeoutError):
    """``wait()`` gave up before the job reached a terminal state; ``job`` is the last one seen."""

    def __init__(self, job: Job, timeout: float) -> None:
        super().__init__(f"job {job.id} is still {job.state} after waiting {timeout:g}s")
        self.job = job
        self.timeout = timeout
