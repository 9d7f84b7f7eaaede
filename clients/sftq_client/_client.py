"""The two clients of the jobs-api, sync and async: thin shells over the transport.

Each method builds a :class:`~sftq_client._transport.Call` with the shared ``Core`` and runs it
through ``_transport.send`` (or ``asend``): behaviour lives once, in ``_transport.py``; the
stream and the webhook endpoints are resources of their own (``resources/``).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from functools import cached_property
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from . import _transport
from ._transport import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
    PREFIX_CANDIDATES,
    Call,
    Core,
    ProgressCallback,
    Waiter,
)
from .errors import Conflict
from .models import (
    CancelResult,
    Capacity,
    Event,
    Job,
    JobAnalytics,
    JobPage,
    Kind,
    QueueContext,
    RetryResult,
    State,
    StreamEvent,
    SubmitResult,
    Summary,
    ValidateResult,
)

__all__ = ["DEFAULT_MAX_RETRIES", "DEFAULT_TIMEOUT", "AsyncClient", "Client"]

T = TypeVar("T")

if TYPE_CHECKING:
    from .resources.webhooks import AsyncWebhooks, Webhooks

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
        self._core = Core(api_key, base_url, timeout=timeout, max_retries=max_retries)
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

    def _send(self, call: Call[T]) -> T:
        return _transport.send(self._http, self._core, call)

    def validate(
        self,
        kind: Kind | str,
        fireworks_payload: Mapping[str, Any],
        *,
        display_name: str | None = None,
        gpu_count: int | None = None,
        queue_timeout_seconds: int | None = None,
    ) -> ValidateResult:
        """Run the queue's pre-flight checks on a job without enqueueing it (POST
        /jobs:validate): ``valid`` is False when submit() would be refused, and ``errors`` say
        where and what to fix."""
        return self._send(
            self._core.validate(
                kind,
                fireworks_payload,
                display_name=display_name,
                gpu_count=gpu_count,
                queue_timeout_seconds=queue_timeout_seconds,
            )
        )

    def submit(
        self,
        kind: Kind | str,
        fireworks_payload: Mapping[str, Any],
        *,
        display_name: str | None = None,
        gpu_count: int | None = None,
        idempotency_key: str | None = None,
        queue_timeout_seconds: int | None = None,
        validate: bool = True,
        after: Sequence[str | SubmitResult | Job] | None = None,
        max_run_seconds: int | None = None,
    ) -> SubmitResult:
        """Enqueue a job. A fresh Idempotency-Key is generated unless one is given.

        ``queue_timeout_seconds`` (1 to 2,592,000): if the job is still QUEUED that long after
        it was submitted, the scheduler cancels it. ``validate=False`` skips the queue's
        pre-flight check of ``fireworks_payload`` (a definite error otherwise raises
        BadRequest with code ``invalid_fireworks_payload``; doubts come back in ``warnings``).

        ``after`` (up to 20 of your jobs: ids, id prefixes, or the SubmitResult / Job of
        each): the job waits QUEUED until every one of them is SUCCESS, and is cancelled if one
        ends FAIL or CANCELLED (a pipeline: an SFT job, then a DPO job that starts from its
        output model). ``max_run_seconds`` (60 to 2,592,000): past that long running at
        Fireworks, the queue stops the job and it ends CANCELLED (reason ``run_timeout``).
        """
        return self._send(
            self._core.submit(
                kind,
                fireworks_payload,
                display_name=display_name,
                gpu_count=gpu_count,
                idempotency_key=idempotency_key,
                queue_timeout_seconds=queue_timeout_seconds,
                validate=validate,
                after=after,
                max_run_seconds=max_run_seconds,
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
        page = self.list_jobs(id_prefix=prefix, limit=PREFIX_CANDIDATES)
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

    def retry(self, job_id: str, *, idempotency_key: str | None = None) -> RetryResult:
        """Enqueue a FAIL or CANCELLED job again as a new job (same kind, payload, display name
        and GPUs) at the back of the queue; the answer's ``retry_of`` names the old one.

        Raises :class:`Conflict` for a job that is QUEUED, PROGRESS or SUCCESS and
        :class:`NotFound` for one that is not yours.
        """
        return self._send(self._core.retry(job_id, idempotency_key=idempotency_key))

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
        waiter = Waiter(job_id, poll_interval, max_interval, timeout)
        while True:
            job = self.get(job_id)
            if on_progress is not None:
                on_progress(job)
            delay = waiter.next_delay(job)
            if delay is None:
                return job
            _transport.sync_sleep(delay)

    def stream(
        self, job_id: str | None = None, *, last_event_id: str | None = None
    ) -> Iterator[StreamEvent]:
        """Live events of one job (until its :class:`EndEvent`) or of all your jobs (endless).

        Reconnects by itself with ``Last-Event-ID`` after a drop or the server's ``reconnect``,
        so no event is missed or seen twice. Raises :class:`StreamUnavailable` when the server
        does not stream (then poll with :meth:`get` / :meth:`wait`).
        """
        from .resources.stream import iter_stream

        return iter_stream(self, job_id, last_event_id)

    def queue_context(self) -> QueueContext:
        return self._send(self._core.queue_context())

    def summary(self) -> Summary:
        return self._send(self._core.summary())

    def job_analytics(self, job_id: str) -> JobAnalytics:
        return self._send(self._core.job_analytics(job_id))

    def iter_events(self, job_id: str, *, page_size: int = 100,
                    after: str | None = None) -> Iterator[Event]:
        """A job's history, oldest first, fetching pages lazily as the iterator advances;
        with ``after`` (an event's id), only the events that follow it."""
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

    @cached_property
    def webhooks(self) -> Webhooks:
        """Your webhook endpoints: create, list, get, delete, test, deliveries."""
        from .resources.webhooks import Webhooks

        return Webhooks(self)

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
        self._core = Core(api_key, base_url, timeout=timeout, max_retries=max_retries)
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

    async def _send(self, call: Call[T]) -> T:
        return await _transport.asend(self._http, self._core, call)

    async def validate(
        self,
        kind: Kind | str,
        fireworks_payload: Mapping[str, Any],
        *,
        display_name: str | None = None,
        gpu_count: int | None = None,
        queue_timeout_seconds: int | None = None,
    ) -> ValidateResult:
        """Run the queue's pre-flight checks on a job without enqueueing it (POST
        /jobs:validate): ``valid`` is False when submit() would be refused, and ``errors`` say
        where and what to fix."""
        return await self._send(
            self._core.validate(
                kind,
                fireworks_payload,
                display_name=display_name,
                gpu_count=gpu_count,
                queue_timeout_seconds=queue_timeout_seconds,
            )
        )

    async def submit(
        self,
        kind: Kind | str,
        fireworks_payload: Mapping[str, Any],
        *,
        display_name: str | None = None,
        gpu_count: int | None = None,
        idempotency_key: str | None = None,
        queue_timeout_seconds: int | None = None,
        validate: bool = True,
        after: Sequence[str | SubmitResult | Job] | None = None,
        max_run_seconds: int | None = None,
    ) -> SubmitResult:
        return await self._send(
            self._core.submit(
                kind,
                fireworks_payload,
                display_name=display_name,
                gpu_count=gpu_count,
                idempotency_key=idempotency_key,
                queue_timeout_seconds=queue_timeout_seconds,
                validate=validate,
                after=after,
                max_run_seconds=max_run_seconds,
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
        page = await self.list_jobs(id_prefix=prefix, limit=PREFIX_CANDIDATES)
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

    async def retry(self, job_id: str, *, idempotency_key: str | None = None) -> RetryResult:
        return await self._send(self._core.retry(job_id, idempotency_key=idempotency_key))

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
        waiter = Waiter(job_id, poll_interval, max_interval, timeout)
        while True:
            job = await self.get(job_id)
            if on_progress is not None:
                result = on_progress(job)
                if inspect.isawaitable(result):
                    await result
            delay = waiter.next_delay(job)
            if delay is None:
                return job
            await _transport.async_sleep(delay)

    def stream(
        self, job_id: str | None = None, *, last_event_id: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        """As :meth:`Client.stream`, for ``async for``."""
        from .resources.stream import aiter_stream

        return aiter_stream(self, job_id, last_event_id)

    async def queue_context(self) -> QueueContext:
        return await self._send(self._core.queue_context())

    async def summary(self) -> Summary:
        return await self._send(self._core.summary())

    async def job_analytics(self, job_id: str) -> JobAnalytics:
        return await self._send(self._core.job_analytics(job_id))

    async def iter_events(self, job_id: str, *, page_size: int = 100,
                          after: str | None = None) -> AsyncIterator[Event]:
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

    @cached_property
    def webhooks(self) -> AsyncWebhooks:
        """As :attr:`Client.webhooks`, awaited."""
        from .resources.webhooks import AsyncWebhooks

        return AsyncWebhooks(self)

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
