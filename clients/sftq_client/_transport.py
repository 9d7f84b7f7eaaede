"""The transport under both clients: configuration, request building, the retry policy, error
mapping, response parsing and the wait() backoff, written once (:class:`Core`, :class:`Call`,
:class:`Waiter`), and the send loop that runs a call, sync and async side by side.

``Client`` and ``AsyncClient`` (``_client.py``) and the resources (``resources/``) build a
:class:`Call` with ``Core`` and hand it to :func:`send` / :func:`asend`.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Final, Generic, TypeVar
from urllib.parse import parse_qs, quote, urlsplit

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from ._version import __version__
from .errors import (
    AmbiguousJobId,
    APIConnectionError,
    BadRequest,
    ConfigurationError,
    Conflict,
    MissingSetting,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    SftqError,
    Timeout,
    Unauthorized,
    WaitTimeout,
)
from .models import (
    CancelResult,
    Capacity,
    EventPage,
    Job,
    JobAnalytics,
    JobPage,
    Kind,
    QueueContext,
    RetryResult,
    State,
    SubmitResult,
    Summary,
    ValidateResult,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

DEFAULT_TIMEOUT: Final = 30.0
DEFAULT_MAX_RETRIES: Final = 3
# The contract's base: every path is under $SUPABASE_URL/functions/v1/jobs-api.
JOBS_API_PATH: Final = "/functions/v1/jobs-api"

_INITIAL_BACKOFF: Final = 0.5
_MAX_BACKOFF: Final = 8.0
# A server asking for a longer pause than this is better reported than silently waited out.
_MAX_RETRY_AFTER: Final = 60.0
_WAIT_BACKOFF_FACTOR: Final = 1.5

_JOB_LIST: Final = TypeAdapter(list[Job])

API_KEY_SETTING: Final = MissingSetting("API key", "api_key", "--api-key", ("SFTQ_API_KEY",))
API_URL_SETTING: Final = MissingSetting(
    "API URL",
    "base_url",
    "--api-url",
    ("SFTQ_API_URL", "SUPABASE_URL"),
    note="with SUPABASE_URL the jobs-api is $SUPABASE_URL/functions/v1/jobs-api",
)
# A job id in full (canonical UUID, or its 32 hex digits), or a prefix of at least 8 digits.
_FULL_ID_RE: Final = re.compile(r"[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}|[0-9a-f]{32}")
_HEX_RE: Final = re.compile(r"[0-9a-f-]+")
MIN_ID_PREFIX: Final = 8
# How many candidates a prefix lookup asks for: enough to show an ambiguity, never a history.
PREFIX_CANDIDATES: Final = 10

# Indirections so tests can replace time without patching the time/asyncio modules themselves.
sync_sleep: Callable[[float], None] = time.sleep
async_sleep: Callable[[float], Any] = asyncio.sleep
monotonic: Callable[[], float] = time.monotonic

ProgressCallback = Callable[[Job], object]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API operation: what to send and how to read a successful answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Mapping[str, str] = field(default_factory=dict)
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    # False for a POST the server cannot deduplicate (no Idempotency-Key): sent once.
    retry: bool = True


def job_path(job_id: str, suffix: str = "") -> str:
    if not isinstance(job_id, str) or not job_id.strip():
        raise ValueError("job_id must be a non-empty string")
    # Quote everything so an id like "../x" cannot address a different route.
    return f"/jobs/{quote(job_id.strip(), safe='')}{suffix}"


def _drop_none(params: Mapping[str, object | None]) -> dict[str, str]:
    return {k: str(v) for k, v in params.items() if v is not None}


def _upper(value: str | None) -> str | None:
    """States and kinds are case-insensitive for callers ("queued" is QUEUED)."""
    return value.upper() if isinstance(value, str) else value


def _parse_retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)


# 429s that a wait does not cure: the caller holds as many QUEUED jobs as the operator allows
# (issue 52). Waiting for jobs to start, end or be cancelled is the caller's decision, so the
# error goes straight back, where `rate_limited` and `too_many_streams` are retried after
# their Retry-After like any 429.
_LIMITS_NOT_RATES: Final = frozenset({"queue_limit"})


def _error_code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


def _is_retryable_status(status: int) -> bool:
    # 501 means "this server will never do that": retrying cannot help.
    return status in (408, 429) or (500 <= status <= 599 and status != 501)


_STATUS_ERRORS: Final[dict[int, type[SftqError]]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: BadRequest,
    422: BadRequest,
    429: RateLimited,
    503: ServiceUnavailable,
}


def _next_cursor(response: httpx.Response) -> str | None:
    cursor: str | None = response.headers.get("x-next-cursor")
    if cursor:
        return cursor
    # Fall back to the Link header so a proxy that strips custom headers does not end paging early.
    url = response.links.get("next", {}).get("url")
    if isinstance(url, str) and url:
        values = parse_qs(urlsplit(url).query).get("cursor")
        if values:
            return str(values[0])
    return None


class Core:
    """Configuration and every piece of logic shared by the sync and async clients."""

    def __init__(
        self,
        api_key: str | None,
        base_url: str | None,
        *,
        timeout: float,
        max_retries: int,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get("SFTQ_API_KEY")
        url = self._base_url_setting(base_url)
        # Every missing setting at once: fixing one only to be told of the next wastes a run.
        missing = tuple(
            setting
            for setting, value in ((API_KEY_SETTING, key), (API_URL_SETTING, url))
            if not value or not value.strip()
        )
        if missing:
            raise ConfigurationError(
                "missing settings: "
                + "; ".join(f"{m.what}: pass {m.ways('python')}" for m in missing),
                missing=missing,
            )
        assert key is not None and url is not None
        self.api_key = key.strip()
        self.base_url = self._check_base_url_form(url)
        # Set once GET /health showed the base URL leads to the jobs-api (see base_url_error).
        self.base_url_verified = False
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.timeout = timeout
        self.max_retries = max_retries
        self._random = random.Random()
        self.default_headers = {
            "Authorization": f"Bearer {self.api_key}",
            "Accept": "application/json",
            "User-Agent": f"sftq-client/{__version__}",
        }

    @staticmethod
    def _base_url_setting(base_url: str | None) -> str | None:
        if base_url:
            return base_url
        if os.environ.get("SFTQ_API_URL"):
            return os.environ["SFTQ_API_URL"]
        if os.environ.get("SUPABASE_URL"):
            return os.environ["SUPABASE_URL"].strip().rstrip("/") + JOBS_API_PATH
        return None

    @staticmethod
    def _check_base_url_form(url: str) -> str:
        url = url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"API URL must start with http:// or https://, got {url!r}")
        return url

    def base_url_error(self, health: httpx.Response) -> ConfigurationError | None:
        """After a 404: whether the base URL is not the jobs-api at all (its GET /health is
        404 too), as when it is a Supabase project's root instead of .../functions/v1/jobs-api.
        Any other answer means it is the jobs-api, and the 404 was about the job."""
        if health.status_code != 404:
            self.base_url_verified = True
            return None
        path = urlsplit(self.base_url).path.rstrip("/")
        suggestion = ""
        if path in ("", "/functions/v1", "/functions"):
            root = self.base_url[: len(self.base_url) - len(path)] if path else self.base_url
            suggestion = f"; did you mean {root}{JOBS_API_PATH}?"
        return ConfigurationError(
            f"the API URL {self.base_url} is not the jobs-api (it has no /health): it must be "
            f"the jobs-api's root, of the form .../functions/v1/jobs-api{suggestion}"
        )

    # ---- job ids -----------------------------------------------------------------------------

    @staticmethod
    def job_id_prefix(job_id: str) -> str | None:
        """None for a full id (or anything that cannot be a prefix); else the prefix's hex digits.

        ValueError for a prefix too short to look up (fewer than 8 characters).
        """
        if not isinstance(job_id, str) or not job_id.strip():
            raise ValueError("job_id must be a non-empty string")
        text = job_id.strip().lower()
        if _FULL_ID_RE.fullmatch(text) or not _HEX_RE.fullmatch(text):
            return None
        digits = text.replace("-", "")
        if len(digits) < MIN_ID_PREFIX:
            raise ValueError(
                f"{job_id.strip()!r} is too short for a job id: give the whole id or at least "
                f"its first {MIN_ID_PREFIX} characters"
            )
        return digits

    @staticmethod
    def pick_job(job_id: str, candidates: list[Job]) -> str:
        if not candidates:
            raise NotFound(f"no job of yours has an id starting with {job_id.strip()}", status=404)
        if len(candidates) > 1:
            raise AmbiguousJobId(job_id.strip(), candidates)
        return candidates[0].id

    # ---- building requests -------------------------------------------------------------------

    def build_request(
        self, http: httpx.Client | httpx.AsyncClient, call: Call[Any]
    ) -> httpx.Request:
        return http.build_request(
            call.method,
            call.path,
            params=dict(call.params) or None,
            json=call.json,
            headers=dict(call.headers) or None,
        )

    def submit(
        self,
        kind: Kind | str,
        fireworks_payload: Mapping[str, Any],
        *,
        display_name: str | None,
        gpu_count: int | None,
        idempotency_key: str | None,
        queue_timeout_seconds: int | None = None,
        validate: bool = True,
        after: Sequence[Any] | None = None,
        max_run_seconds: int | None = None,
    ) -> Call[SubmitResult]:
        body = self._job_body(kind, fireworks_payload, display_name, gpu_count,
                              queue_timeout_seconds)
        if not validate:
            body["validate"] = "off"
        # Issue 53: the jobs this one runs after (ids, or anything with an ``id``: a
        # SubmitResult, a Job), and its bound on run time.
        if after is not None:
            if isinstance(after, (str, bytes)):
                raise TypeError("after must be a list of job ids, not one string")
            body["after"] = [str(getattr(a, "id", a)) for a in after]
        if max_run_seconds is not None:
            body["max_run_seconds"] = max_run_seconds
        # Generated once per submit() and reused by every retry: the server dedupes on it, which is
        # the only thing that makes retrying a POST safe.
        key = idempotency_key or str(uuid.uuid4())
        return Call(
            "POST",
            "/jobs",
            model_parser(SubmitResult),
            json=body,
            headers={"Idempotency-Key": key},
        )

    def validate(
        self,
        kind: Kind | str,
        fireworks_payload: Mapping[str, Any],
        *,
        display_name: str | None,
        gpu_count: int | None,
        queue_timeout_seconds: int | None = None,
    ) -> Call[ValidateResult]:
        body = self._job_body(kind, fireworks_payload, display_name, gpu_count,
                              queue_timeout_seconds)
        return Call("POST", "/jobs:validate", model_parser(ValidateResult), json=body)

    @staticmethod
    def _job_body(kind: Kind | str, fireworks_payload: Mapping[str, Any],
                  display_name: str | None, gpu_count: int | None,
                  queue_timeout_seconds: int | None) -> dict[str, Any]:
        if not isinstance(fireworks_payload, Mapping):
            raise TypeError(
                "fireworks_payload must be a mapping (the body you would send to Fireworks)"
            )
        # Kinds are case-insensitive here, as in the CLI; the API's body wants upper case.
        upper = kind.upper() if isinstance(kind, str) else kind
        body: dict[str, Any] = {"kind": upper, "fireworks_payload": dict(fireworks_payload)}
        if display_name is not None:
            body["display_name"] = display_name
        if gpu_count is not None:
            body["gpu_count"] = gpu_count
        if queue_timeout_seconds is not None:
            body["queue_timeout_seconds"] = queue_timeout_seconds
        return body

    def list_jobs(
        self,
        *,
        state: State | str | None,
        kind: Kind | str | None,
        limit: int | None,
        cursor: str | None,
        id_prefix: str | None = None,
    ) -> Call[JobPage]:
        params = _drop_none(
            {
                "state": _upper(state),
                "kind": _upper(kind),
                "limit": limit,
                "cursor": cursor,
                "id_prefix": id_prefix,
            }
        )

        def parse(response: httpx.Response) -> JobPage:
            items = _JOB_LIST.validate_python(response.json())
            return JobPage(items=items, next_cursor=_next_cursor(response))

        return Call("GET", "/jobs", parse, params=params)

    def get(self, job_id: str) -> Call[Job]:
        return Call("GET", job_path(job_id), model_parser(Job))

    def cancel(self, job_id: str) -> Call[CancelResult]:
        def parse(response: httpx.Response) -> CancelResult:
            data = response.json()
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            return CancelResult.model_validate({**data, "pending": response.status_code == 202})

        return Call("DELETE", job_path(job_id), parse)

    @staticmethod
    def cancel_landed_earlier(error: Conflict) -> bool:
        """Whether a 409 on cancel may answer our own earlier attempt, so the job is worth a look.

        When a DELETE succeeds but its response is lost, the retry finds the job CANCELLED and
        gets 409. Reporting that as a failure would be wrong; the caller re-reads the job.
        """
        return error.attempts > 1

    @staticmethod
    def resolve_cancel_conflict(job: Job, error: Conflict) -> CancelResult:
        if job.state != "CANCELLED":
            raise error
        return CancelResult.model_validate({**job.model_dump(), "pending": False})

    def retry(self, job_id: str, *, idempotency_key: str | None) -> Call[RetryResult]:
        # As for submit: one key for every attempt, so a retried POST makes one new job.
        key = idempotency_key or str(uuid.uuid4())
        return Call(
            "POST",
            job_path(job_id, "/retry"),
            model_parser(RetryResult),
            headers={"Idempotency-Key": key},
        )

    def queue_context(self) -> Call[QueueContext]:
        return Call("GET", "/jobs/analytics/queue", model_parser(QueueContext))

    def summary(self) -> Call[Summary]:
        return Call("GET", "/jobs/analytics/summary", model_parser(Summary))

    def job_analytics(self, job_id: str) -> Call[JobAnalytics]:
        return Call("GET", job_path(job_id, "/analytics"), model_parser(JobAnalytics))

    def events_page(
        self, job_id: str, *, limit: int | None, after: str | None
    ) -> Call[EventPage]:
        params = _drop_none({"limit": limit, "after": after})
        return Call("GET", job_path(job_id, "/events"), model_parser(EventPage), params=params)

    @staticmethod
    def next_after(page: EventPage, seen: set[str]) -> str | None:
        """The `after` of the page following `page`, or None when there is none (or the
        server repeats itself, which would otherwise loop forever)."""
        if not page.has_more or not page.data:
            return None
        after = page.data[-1].id
        if after in seen:
            return None
        seen.add(after)
        return after

    def capacity(self) -> Call[Capacity]:
        return Call("GET", "/capacity", model_parser(Capacity))

    def health(self) -> Call[dict[str, Any]]:
        def parse(response: httpx.Response) -> dict[str, Any]:
            data = response.json()
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            return data

        return Call("GET", "/health", parse)

    # ---- retries -----------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        delay: float = min(_INITIAL_BACKOFF * 2**attempt, _MAX_BACKOFF)
        # Jitter spreads out clients that failed together so they do not retry in lockstep.
        return delay * (1 - 0.25 * self._random.random())

    def retry_delay_for_response(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to sleep before retrying, or None to stop and hand the response to finish()."""
        if attempt >= self.max_retries or not _is_retryable_status(response.status_code):
            return None
        if response.status_code == 429 and _error_code(response) in _LIMITS_NOT_RATES:
            return None
        retry_after = _parse_retry_after(response.headers.get("retry-after"))
        if retry_after is None:
            return self._backoff(attempt)
        if retry_after > _MAX_RETRY_AFTER:
            return None
        return retry_after

    def retry_delay_for_error(self, error: httpx.TransportError, attempt: int) -> float | None:
        # Every call is safe to resend: GET and DELETE are idempotent and every POST carries an
        # Idempotency-Key, so even a request that reached the server before failing may go again.
        if attempt >= self.max_retries:
            return None
        return self._backoff(attempt)

    # ---- reading answers ---------------------------------------------------------------------

    def finish(self, call: Call[T], response: httpx.Response, attempt: int) -> T:
        if not response.is_success:
            error = self.error_for_response(response)
            error.attempts = attempt + 1
            raise error
        try:
            return call.parse(response)
        except (ValueError, ValidationError) as exc:
            # json.JSONDecodeError is a ValueError. Say what went wrong without echoing the body,
            # which could be a large HTML error page from a proxy.
            raise SftqError(
                f"unexpected response from {call.method} {call.path}: {type(exc).__name__}",
                status=response.status_code,
                body=self._scrub(decode_body(response)),
            ) from None

    def error_for_response(self, response: httpx.Response) -> SftqError:
        body = self._scrub(decode_body(response))
        message: str | None = None
        code: str | None = None
        if isinstance(body, dict):
            if isinstance(body.get("error"), str):
                message = body["error"]
            elif isinstance(body.get("message"), str):
                message = body["message"]
            if isinstance(body.get("code"), str):
                code = body["code"]
        if not message:
            reason = response.reason_phrase or "error"
            message = f"HTTP {response.status_code} {reason}"
        status = response.status_code
        cls = _STATUS_ERRORS.get(status) or (ServerError if status >= 500 else SftqError)
        return cls(
            message,
            status=status,
            code=code,
            body=body,
            retry_after=_parse_retry_after(response.headers.get("retry-after")),
        )

    def error_for_transport(
        self, error: httpx.TransportError, request: httpx.Request, attempt: int
    ) -> SftqError:
        # The URL never contains the key (it travels in a header), so naming it is safe and useful.
        where = f"{request.method} {request.url}"
        detail = self._scrub(str(error)) or type(error).__name__
        mapped: SftqError
        if isinstance(error, httpx.TimeoutException):
            mapped = Timeout(f"request timed out: {where} ({detail})")
        else:
            mapped = APIConnectionError(f"could not reach the jobs-api: {where} ({detail})")
        mapped.attempts = attempt + 1
        return mapped

    def _scrub(self, value: Any) -> Any:
        """Remove the API key from anything that may end up in an exception or a log line."""
        if isinstance(value, str):
            return value.replace(self.api_key, "sftq_***") if self.api_key in value else value
        if isinstance(value, dict):
            return {k: self._scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._scrub(v) for v in value]
        return value


def decode_body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (ValueError, UnicodeDecodeError):
        text = response.text
        return text[:2000] if text else None


def model_parser(model: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        return model.model_validate(response.json())

    return parse


class Waiter:
    """The polling schedule of wait(): back off while nothing changes, start over when it does."""

    def __init__(
        self, job_id: str, poll_interval: float, max_interval: float, timeout: float | None
    ) -> None:
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        if max_interval < poll_interval:
            raise ValueError("max_interval must be >= poll_interval")
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0")
        job_path(job_id)  # same validation as get(), before the first request
        self._poll = poll_interval
        self._max = max_interval
        self._timeout = timeout
        self._deadline = None if timeout is None else monotonic() + timeout
        self._delay = poll_interval
        self._last_state: str | None = None

    def next_delay(self, job: Job) -> float | None:
        """None once the job is terminal, else seconds to sleep; WaitTimeout at the deadline."""
        changed = job.state != self._last_state
        self._last_state = job.state
        if job.is_terminal:
            return None
        self._delay = self._poll if changed else min(self._delay * _WAIT_BACKOFF_FACTOR, self._max)
        if self._deadline is None or self._timeout is None:
            return self._delay
        remaining = self._deadline - monotonic()
        if remaining <= 0:
            raise WaitTimeout(job, self._timeout)
        # Sleep at most until the deadline so the last poll happens right at it, not after.
        return min(self._delay, remaining)


# ---- sending: one call, with the retry policy, sync and async side by side ---------------------


def send(http: httpx.Client, core: Core, call: Call[T]) -> T:
    """Run one call to its answer; after a 404, check the base URL is the jobs-api at all."""
    try:
        return _send_with_retries(http, core, call)
    except NotFound:
        _check_base_url(http, core)
        raise


def _check_base_url(http: httpx.Client, core: Core) -> None:
    """After a 404: fail with ConfigurationError if the base URL is not the jobs-api."""
    if core.base_url_verified:
        return
    try:
        health = http.get("/health")
    except httpx.TransportError:
        return  # cannot tell; the 404 stands
    error = core.base_url_error(health)
    if error is not None:
        raise error from None


def _send_with_retries(http: httpx.Client, core: Core, call: Call[T]) -> T:
    attempt = 0
    while True:
        request = core.build_request(http, call)
        try:
            response = http.send(request)
        except httpx.TransportError as exc:
            delay = core.retry_delay_for_error(exc, attempt) if call.retry else None
            if delay is None:
                raise core.error_for_transport(exc, request, attempt) from None
        else:
            delay = core.retry_delay_for_response(response, attempt) if call.retry else None
            if delay is None:
                return core.finish(call, response, attempt)
        sync_sleep(delay)
        attempt += 1


async def asend(http: httpx.AsyncClient, core: Core, call: Call[T]) -> T:
    """The async twin of :func:`send`."""
    try:
        return await _asend_with_retries(http, core, call)
    except NotFound:
        await _acheck_base_url(http, core)
        raise


async def _acheck_base_url(http: httpx.AsyncClient, core: Core) -> None:
    if core.base_url_verified:
        return
    try:
        health = await http.get("/health")
    except httpx.TransportError:
        return
    error = core.base_url_error(health)
    if error is not None:
        raise error from None


async def _asend_with_retries(http: httpx.AsyncClient, core: Core, call: Call[T]) -> T:
    attempt = 0
    while True:
        request = core.build_request(http, call)
        try:
            response = await http.send(request)
        except httpx.TransportError as exc:
            delay = core.retry_delay_for_error(exc, attempt) if call.retry else None
            if delay is None:
                raise core.error_for_transport(exc, request, attempt) from None
        else:
            delay = core.retry_delay_for_response(response, attempt) if call.retry else None
            if delay is None:
                return core.finish(call, response, attempt)
        await async_sleep(delay)
        attempt += 1
