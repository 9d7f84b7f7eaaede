"""Sync and async clients for the jobs-api.

All behaviour (configuration, request building, the retry policy, error mapping, response
parsing, the wait() backoff) lives once in :class:`_Core` and the small ``_Call``/``_Waiter``
helpers. ``Client`` and ``AsyncClient`` are thin transports around it: each method builds a
``_Call`` and runs it through a send loop that differs only in ``await``.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
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
    Event,
    EventPage,
    Job,
    JobAnalytics,
    JobPage,
    Kind,
    QueueContext,
    State,
    StreamEvent,
    SubmitResult,
    Summary,
)

__all__ = ["DEFAULT_MAX_RETRIES", "DEFAULT_TIMEOUT", "AsyncClient", "Client"]

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

_API_KEY_SETTING: Final = MissingSetting("API key", "api_key", "--api-key", ("SFTQ_API_KEY",))
_API_URL_SETTING: Final = MissingSetting(
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
_PREFIX_CANDIDATES: Final = 10

# Indirections so tests can replace time without patching the time/asyncio modules themselves.
_sync_sleep: Callable[[float], None] = time.sleep
_async_sleep: Callable[[float], Any] = asyncio.sleep
_monotonic: Callable[[], float] = time.monotonic

ProgressCallback = Callable[[Job], object]


@dataclass(frozen=True)
class _Call(Generic[T]):
    """One API operation: what to send and how to read a successful answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Mapping[str, str] = field(default_factory=dict)
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


def _job_path(job_id: str, suffix: str = "") -> str:
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


class _Core:
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
            for setting, value in ((_API_KEY_SETTING, key), (_API_URL_SETTING, url))
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
        self, http: httpx.Client | httpx.AsyncClient, call: _Call[Any]
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
    ) -> _Call[SubmitResult]:
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
        # Generated once per submit() and reused by every retry: the server dedupes on it, which is
        # the only thing that makes retrying a POST safe.
        key = idempotency_key or str(uuid.uuid4())
        return _Call(
            "POST",
            "/jobs",
            _model_parser(SubmitResult),
            json=body,
            headers={"Idempotency-Key": key},
        )

    def list_jobs(
        self,
        *,
        state: State | str | None,
        kind: Kind | str | None,
        limit: int | None,
        cursor: str | None,
        id_prefix: str | None = None,
    ) -> _Call[JobPage]:
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

        return _Call("GET", "/jobs", parse, params=params)

    def get(self, job_id: str) -> _Call[Job]:
        return _Call("GET", _job_path(job_id), _model_parser(Job))

    def cancel(self, job_id: str) -> _Call[CancelResult]:
        def parse(response: httpx.Response) -> CancelResult:
            data = response.json()
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            return CancelResult.model_validate({**data, "pending": response.status_code == 202})

        return _Call("DELETE", _job_path(job_id), parse)

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

    def queue_context(self) -> _Call[QueueContext]:
        return _Call("GET", "/jobs/analytics/queue", _model_parser(QueueContext))

    def summary(self) -> _Call[Summary]:
        return _Call("GET", "/jobs/analytics/summary", _model_parser(Summary))

    def job_analytics(self, job_id: str) -> _Call[JobAnalytics]:
        return _Call("GET", _job_path(job_id, "/analytics"), _model_parser(JobAnalytics))

    def events_page(
        self, job_id: str, *, limit: int | None, after: str | None
    ) -> _Call[EventPage]:
        params = _drop_none({"limit": limit, "after": after})
        return _Call("GET", _job_path(job_id, "/events"), _model_parser(EventPage), params=params)

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

    def capacity(self) -> _Call[Capacity]:
        return _Call("GET", "/capacity", _model_parser(Capacity))

    def health(self) -> _Call[dict[str, Any]]:
        def parse(response: httpx.Response) -> dict[str, Any]:
            data = response.json()
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            return data

        return _Call("GET", "/health", parse)

    # ---- retries -----------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        delay: float = min(_INITIAL_BACKOFF * 2**attempt, _MAX_BACKOFF)
        # Jitter spreads out clients that failed together so they do not retry in lockstep.
        return delay * (1 - 0.25 * self._random.random())

    def retry_delay_for_response(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to sleep before retrying, or None to stop and hand the response to finish()."""
        if attempt >= self.max_retries or not _is_retryable_status(response.status_code):
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

    def finish(self, call: _Call[T], response: httpx.Response, attempt: int) -> T:
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
                body=self._scrub(_decode_body(response)),
            ) from None

    def error_for_response(self, response: httpx.Response) -> SftqError:
        body = self._scrub(_decode_body(response))
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


def _decode_body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (ValueError, UnicodeDecodeError):
        text = response.text
        return text[:2000] if text else None


def _model_parser(model: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        return model.model_validate(response.json())

    return parse


class _Waiter:
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
        _job_path(job_id)  # same validation as get(), before the first request
        self._poll = poll_interval
        self._max = max_interval
        self._timeout = timeout
        self._deadline = None if timeout is None else _monotonic() + timeout
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
        remaining = self._deadline - _monotonic()
        if remaining <= 0:
            raise WaitTimeout(job, self._timeout)
        # Sleep at most until the deadline so the last poll happens right at it, not after.
        return min(self._delay, remaining)


# ---- the two transports ------------------------------------------------------------------------


class Client:
    """Synchronous client for the jobs-api.

    ``api_key`` defaults to ``$SFTQ_API_KEY``; ``base_url`` (the jobs-api root, e.g.
    ``https://x.supabase.co/functions/v1/jobs-api``) defaults to ``$SFTQ_API_URL``, else
    ``$SUPABASE_URL`` + ``/functions/v1/jobs-api``. ``transport`` lets tests (or a proxy setup)
    supply any httpx transport.
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._core = _Core(api_key, base_url, timeout=timeout, max_retries=max_retries)
        self._http = httpx.Client(
            base_url=self._core.base_url,
            headers=self._core.default_headers,
            timeout=timeout,
            transport=transport,
        )

    @property
    def base_url(self) -> str:
        return self._core.base_url

    def __repr__(self) -> str:
        return f"Client(base_url={self._core.base_url!r})"

    def _send(self, call: _Call[T]) -> T:
        try:
            return self._send_with_retries(call)
        except NotFound:
            self._check_base_url()
            raise

    def _check_base_url(self) -> None:
        """After a 404: fail with ConfigurationError if the base URL is not the jobs-api."""
        if self._core.base_url_verified:
            return
        try:
            health = self._http.get("/health")
        except httpx.TransportError:
            return  # cannot tell; the 404 stands
        error = self._core.base_url_error(health)
        if error is not None:
            raise error from None

    def _send_with_retries(self, call: _Call[T]) -> T:
        attempt = 0
        while True:
            request = self._core.build_request(self._http, call)
            try:
                response = self._http.send(request)
            except httpx.TransportError as exc:
                delay = self._core.retry_delay_for_error(exc, attempt)
                if delay is None:
                    raise self._core.error_for_transport(exc, request, attempt) from None
            else:
                delay = self._core.retry_delay_for_response(response, attempt)
                if delay is None:
                    return self._core.finish(call, response, attempt)
            _sync_sleep(delay)
            attempt += 1

    def submit(
        self,
        kind: Kind | str,
        fireworks_payload: Mapping[str, Any],
        *,
        display_name: str | None = None,
        gpu_count: int | None = None,
        idempotency_key: str | None = None,
    ) -> SubmitResult:
        """Enqueue a job. A fresh Idempotency-Key is generated unless one is given."""
        return self._send(
            self._core.submit(
                kind,
                fireworks_payload,
                display_name=display_name,
                gpu_count=gpu_count,
                idempotency_key=idempotency_key,
            )
        )

    def list_jobs(
        self,
        *,
        state: State | str | None = None,
        kind: Kind | str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        id_prefix: str | None = None,
    ) -> JobPage:
        """The caller's jobs, newest first: one page with ``limit``; without ``limit`` and
        ``cursor``, the server answers every job in one response (``iter_jobs`` follows pages).
        ``state`` and ``kind`` are case-insensitive; ``id_prefix`` (8 or more hex digits) keeps
        the jobs whose id starts with it (one page, never more)."""
        return self._send(
            self._core.list_jobs(
                state=state, kind=kind, limit=limit, cursor=cursor, id_prefix=id_prefix
            )
        )

    def resolve_job_id(self, job_id: str) -> str:
        """The full id of one of your jobs, from its full id (no request) or an unambiguous
        prefix of at least 8 characters (``0f6c1c9e``). NotFound when none of your jobs starts
        with it, AmbiguousJobId (with the candidates) when several do, ValueError when the
        prefix is shorter than 8."""
        prefix = self._core.job_id_prefix(job_id)
        if prefix is None:
            return job_id.strip()
        page = self.list_jobs(id_prefix=prefix, limit=_PREFIX_CANDIDATES)
        return self._core.pick_job(job_id, page.items)

    def iter_jobs(
        self,
        *,
        state: State | str | None = None,
        kind: Kind | str | None = None,
        page_size: int = 100,
    ) -> Iterator[Job]:
        """Every matching job, newest first, fetching pages lazily as the iterator advances."""
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            page = self.list_jobs(state=state, kind=kind, limit=page_size, cursor=cursor)
            yield from page.items
            if page.next_cursor is None or page.next_cursor in seen:
                return
            seen.add(page.next_cursor)
            cursor = page.next_cursor

    def get(self, job_id: str) -> Job:
        return self._send(self._core.get(job_id))

    def cancel(self, job_id: str) -> CancelResult:
        """Cancel a job; ``pending`` tells a finished cancel from one the scheduler completes."""
        try:
            return self._send(self._core.cancel(job_id))
        except Conflict as exc:
            if not self._core.cancel_landed_earlier(exc):
                raise
            return self._core.resolve_cancel_conflict(self.get(job_id), exc)

    def wait(
        self,
        job_id: str,
        *,
        poll_interval: float = 5.0,
        max_interval: float = 60.0,
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> Job:
        """Poll until the job is SUCCESS, FAIL or CANCELLED and return it.

        ``on_progress`` is called with the job after *every* poll, including the last one.
        Raises WaitTimeout when ``timeout`` seconds pass first.
        """
        waiter = _Waiter(job_id, poll_interval, max_interval, timeout)
        while True:
            job = self.get(job_id)
            if on_progress is not None:
                on_progress(job)
            delay = waiter.next_delay(job)
            if delay is None:
                return job
            _sync_sleep(delay)

    def stream(
        self, job_id: str | None = None, *, last_event_id: str | None = None
    ) -> Iterator[StreamEvent]:
        """Live events of one job (until its :class:`EndEvent`) or of all your jobs (endless).

        Reconnects by itself with ``Last-Event-ID`` after a drop or the server's ``reconnect``,
        so no event is missed or seen twice. Raises :class:`StreamUnavailable` when the server
        does not stream (then poll with :meth:`get` / :meth:`wait`).
        """
        from ._stream import iter_stream

        return iter_stream(self, job_id, last_event_id)

    def queue_context(self) -> QueueContext:
        return self._send(self._core.queue_context())

    def summary(self) -> Summary:
        return self._send(self._core.summary())

    def job_analytics(self, job_id: str) -> JobAnalytics:
        return self._send(self._core.job_analytics(job_id))

    def iter_events(self, job_id: str, *, page_size: int = 100) -> Iterator[Event]:
        """A job's history, oldest first, fetching pages lazily as the iterator advances."""
        after: str | None = None
        seen: set[str] = set()
        while True:
            page = self._send(self._core.events_page(job_id, limit=page_size, after=after))
            yield from page.data
            after = self._core.next_after(page, seen)
            if after is None:
                return

    def list_events(self, job_id: str) -> list[Event]:
        """Every event of one of your jobs, oldest first (``GET /jobs/{id}/events``, all pages)."""
        return list(self.iter_events(job_id))

    def capacity(self) -> Capacity:
        """``GET /capacity``: the GPU quota as last read, what runs and waits, per user."""
        return self._send(self._core.capacity())

    def health(self) -> dict[str, Any]:
        """``GET /health`` on the jobs-api; the body as a dict."""
        return self._send(self._core.health())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClient:
    """Asynchronous twin of :class:`Client`: same constructor, same methods, awaited."""

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._core = _Core(api_key, base_url, timeout=timeout, max_retries=max_retries)
        self._http = httpx.AsyncClient(
            base_url=self._core.base_url,
            headers=self._core.default_headers,
            timeout=timeout,
            transport=transport,
        )

    @property
    def base_url(self) -> str:
        return self._core.base_url

    def __repr__(self) -> str:
        return f"AsyncClient(base_url={self._core.base_url!r})"

    async def _send(self, call: _Call[T]) -> T:
        try:
            return await self._send_with_retries(call)
        except NotFound:
            await self._check_base_url()
            raise

    async def _check_base_url(self) -> None:
        if self._core.base_url_verified:
            return
        try:
            health = await self._http.get("/health")
        except httpx.TransportError:
            return
        error = self._core.base_url_error(health)
        if error is not None:
            raise error from None

    async def _send_with_retries(self, call: _Call[T]) -> T:
        attempt = 0
        while True:
            request = self._core.build_request(self._http, call)
            try:
                response = await self._http.send(request)
            except httpx.TransportError as exc:
                delay = self._core.retry_delay_for_error(exc, attempt)
                if delay is None:
                    raise self._core.error_for_transport(exc, request, attempt) from None
            else:
                delay = self._core.retry_delay_for_response(response, attempt)
                if delay is None:
                    return self._core.finish(call, response, attempt)
            await _async_sleep(delay)
            attempt += 1

    async def submit(
        self,
        kind: Kind | str,
        fireworks_payload: Mapping[str, Any],
        *,
        display_name: str | None = None,
        gpu_count: int | None = None,
        idempotency_key: str | None = None,
    ) -> SubmitResult:
        return await self._send(
            self._core.submit(
                kind,
                fireworks_payload,
                display_name=display_name,
                gpu_count=gpu_count,
                idempotency_key=idempotency_key,
            )
        )

    async def list_jobs(
        self,
        *,
        state: State | str | None = None,
        kind: Kind | str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        id_prefix: str | None = None,
    ) -> JobPage:
        return await self._send(
            self._core.list_jobs(
                state=state, kind=kind, limit=limit, cursor=cursor, id_prefix=id_prefix
            )
        )

    async def resolve_job_id(self, job_id: str) -> str:
        """As :meth:`Client.resolve_job_id`."""
        prefix = self._core.job_id_prefix(job_id)
        if prefix is None:
            return job_id.strip()
        page = await self.list_jobs(id_prefix=prefix, limit=_PREFIX_CANDIDATES)
        return self._core.pick_job(job_id, page.items)

    async def iter_jobs(
        self,
        *,
        state: State | str | None = None,
        kind: Kind | str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[Job]:
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            page = await self.list_jobs(state=state, kind=kind, limit=page_size, cursor=cursor)
            for job in page.items:
                yield job
            if page.next_cursor is None or page.next_cursor in seen:
                return
            seen.add(page.next_cursor)
            cursor = page.next_cursor

    async def get(self, job_id: str) -> Job:
        return await self._send(self._core.get(job_id))

    async def cancel(self, job_id: str) -> CancelResult:
        try:
            return await self._send(self._core.cancel(job_id))
        except Conflict as exc:
            if not self._core.cancel_landed_earlier(exc):
                raise
            return self._core.resolve_cancel_conflict(await self.get(job_id), exc)

    async def wait(
        self,
        job_id: str,
        *,
        poll_interval: float = 5.0,
        max_interval: float = 60.0,
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> Job:
        """As :meth:`Client.wait`; ``on_progress`` may be a plain or a coroutine function."""
        waiter = _Waiter(job_id, poll_interval, max_interval, timeout)
        while True:
            job = await self.get(job_id)
            if on_progress is not None:
                result = on_progress(job)
                if inspect.isawaitable(result):
                    await result
            delay = waiter.next_delay(job)
            if delay is None:
                return job
            await _async_sleep(delay)

    def stream(
        self, job_id: str | None = None, *, last_event_id: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        """As :meth:`Client.stream`, for ``async for``."""
        from ._stream import aiter_stream

        return aiter_stream(self, job_id, last_event_id)

    async def queue_context(self) -> QueueContext:
        return await self._send(self._core.queue_context())

    async def summary(self) -> Summary:
        return await self._send(self._core.summary())

    async def job_analytics(self, job_id: str) -> JobAnalytics:
        return await self._send(self._core.job_analytics(job_id))

    async def iter_events(self, job_id: str, *, page_size: int = 100) -> AsyncIterator[Event]:
        after: str | None = None
        seen: set[str] = set()
        while True:
            page = await self._send(self._core.events_page(job_id, limit=page_size, after=after))
            for event in page.data:
                yield event
            after = self._core.next_after(page, seen)
            if after is None:
                return

    async def list_events(self, job_id: str) -> list[Event]:
        return [event async for event in self.iter_events(job_id)]

    async def capacity(self) -> Capacity:
        return await self._send(self._core.capacity())

    async def health(self) -> dict[str, Any]:
        return await self._send(self._core.health())

    async def close(self) -> None:
        await self._http.aclose()

    aclose = close

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
