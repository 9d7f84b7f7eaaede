"""The live stream for the clients: typed events from GET /jobs/{id}/stream and GET /jobs/stream,
resumed with Last-Event-ID after a drop or the server's ``reconnect``.

httpx-sse parses the wire format (it is small, typed and maintained next to httpx); this module
adds what the protocol leaves to the client: typed events, resuming where it left off, backing
off while the server is unreachable, and telling "this server cannot stream" (501, or a server
without the route) apart from errors a retry cannot fix.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final, Protocol

import httpx
from httpx_sse import ServerSentEvent, aconnect_sse, connect_sse
from pydantic import ValidationError

from .. import _transport
from .._transport import Core, job_path
from ..errors import APIConnectionError, SftqError, WaitTimeout
from ..models import EndEvent, Job, ProgressEvent, QueueEvent, StatusEvent, StreamEvent


class StreamingClient(Protocol):
    """What the stream needs of a Client: its transport core, its HTTP client and get()."""

    _core: Core
    _http: httpx.Client

    def get(self, job_id: str) -> Job: ...


class AsyncStreamingClient(Protocol):
    _core: Core
    _http: httpx.AsyncClient

__all__ = ["StreamUnavailable", "parse_event"]

# Longer than the server's heartbeat (15 s by default): silence past this is a dead connection.
READ_TIMEOUT: Final = 45.0


class StreamUnavailable(SftqError):
    """The server does not stream (501, or it has no stream route): poll instead."""


def parse_event(sse: ServerSentEvent) -> StreamEvent | str | None:
    """A typed event; "reconnect" for the server's request to reconnect; None to skip."""
    kind = sse.event
    if kind == "message" and not sse.data:
        return None  # httpx-sse reports the blank line after a `: ping` heartbeat this way
    if kind == "reconnect":
        return "reconnect"
    try:
        data: Any = json.loads(sse.data) if sse.data else {}
        if kind == "status":
            return StatusEvent(id=sse.id, job=Job.model_validate(data))
        if kind == "progress":
            return ProgressEvent.model_validate({**data, "id": sse.id})
        if kind == "queue":
            return QueueEvent.model_validate({**data, "id": sse.id})
        if kind == "end":
            return EndEvent.model_validate({**data, "id": sse.id})
    except (ValueError, ValidationError):
        return None  # a frame this client does not understand (a newer server): skip it
    return None


class _Resume:
    """What the sync and async readers share: the path, the resume point, the retry policy."""

    def __init__(self, core: Core, job_id: str | None, last_event_id: str | None,
                 deadline: float | None) -> None:
        self.core = core
        self.path = "/jobs/stream" if job_id is None else job_path(job_id, "/stream")
        self.last_event_id = last_event_id
        self.deadline = deadline
        self.failures = 0
        self.connected_once = False

    def headers(self) -> dict[str, str]:
        h = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
        if self.last_event_id:
            h["Last-Event-ID"] = self.last_event_id
        return h

    def timeout(self) -> httpx.Timeout:
        read = READ_TIMEOUT
        if self.deadline is not None:
            read = max(0.05, min(read, self.deadline - time.monotonic()))
        return httpx.Timeout(self.core.timeout, read=read)

    def check_response(self, response: httpx.Response) -> float | None:
        """None when the stream is open; else the seconds to wait before trying again, or raise."""
        if response.status_code == 200 and response.headers.get(
                "content-type", "").startswith("text/event-stream"):
            self.connected_once = True
            self.failures = 0
            return None
        response.read()
        if response.status_code == 200 or response.status_code in (405, 501) or (
                response.status_code == 404 and not self._is_our_404(response)):
            raise StreamUnavailable(
                f"the server at {self.core.base_url} does not stream "
                f"(HTTP {response.status_code}); poll instead", status=response.status_code)
        if response.status_code == 400 and self.last_event_id and self.connected_once:
            # Our resume point is gone (e.g. pruned): start afresh rather than fail.
            self.last_event_id = None
            return 0.0
        delay = self.core.retry_delay_for_response(response, self.failures)
        if delay is None:
            raise self.core.error_for_response(response)
        self.failures += 1
        return delay

    @staticmethod
    def _is_our_404(response: httpx.Response) -> bool:
        try:
            body = response.json()
        except ValueError:
            return False
        # Ours says "job not found"; a server without the route says "no such route".
        return isinstance(body, dict) and "job" in str(body.get("error", ""))

    def after_drop(self, error: Exception | None) -> float:
        """A connection that failed or ended without `end`: wait this long, or raise."""
        self.check_deadline()
        if (self.failures >= max(1, self.core.max_retries) and not self.connected_once
                and isinstance(error, httpx.TransportError)):
            raise APIConnectionError(
                    f"could not reach the stream at {self.core.base_url}{self.path}: "
                    f"{type(error).__name__}") from None
        delay: float = self.core._backoff(min(self.failures, 5))
        self.failures += 1
        return delay

    def check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise TimeoutError


def iter_stream(client: StreamingClient, job_id: str | None, last_event_id: str | None = None,
                deadline: float | None = None) -> Iterator[StreamEvent]:
    """Events of one job (ends after its EndEvent) or of all the caller's jobs (never ends),
    across reconnects. TimeoutError at `deadline` (monotonic seconds)."""
    state = _Resume(client._core, job_id, last_event_id, deadline)
    http = client._http
    while True:
        error: Exception | None = None
        try:
            with connect_sse(http, "GET", state.path, headers=state.headers(),
                             timeout=state.timeout()) as source:
                delay = state.check_response(source.response)
                if delay is None:
                    for sse in source.iter_sse():
                        event = parse_event(sse)
                        if event is None:
                            state.check_deadline()
                            continue
                        if event == "reconnect":
                            break
                        assert not isinstance(event, str)
                        state.last_event_id = event.id or state.last_event_id
                        yield event
                        if isinstance(event, EndEvent):
                            return
                    else:
                        delay = state.after_drop(None)
                    if delay is None:
                        delay = 0.0
        except (httpx.TransportError, httpx.StreamError) as exc:
            error = exc
            delay = state.after_drop(exc)
        if error is None:
            state.check_deadline()
        if delay:
            _transport.sync_sleep(delay)


async def aiter_stream(client: AsyncStreamingClient, job_id: str | None,
                       last_event_id: str | None = None,
                       deadline: float | None = None) -> AsyncIterator[StreamEvent]:
    """The async twin of :func:`iter_stream`."""
    state = _Resume(client._core, job_id, last_event_id, deadline)
    http = client._http
    while True:
        error: Exception | None = None
        try:
            async with aconnect_sse(http, "GET", state.path, headers=state.headers(),
                                    timeout=state.timeout()) as source:
                if source.response.status_code != 200:
                    await source.response.aread()
                delay = state.check_response(source.response)
                if delay is None:
                    ended_by_server = False
                    async for sse in source.aiter_sse():
                        event = parse_event(sse)
                        if event is None:
                            state.check_deadline()
                            continue
                        if event == "reconnect":
                            ended_by_server = True
                            break
                        assert not isinstance(event, str)
                        state.last_event_id = event.id or state.last_event_id
                        yield event
                        if isinstance(event, EndEvent):
                            return
                    delay = 0.0 if ended_by_server else state.after_drop(None)
        except (httpx.TransportError, httpx.StreamError) as exc:
            error = exc
            delay = state.after_drop(exc)
        if error is None:
            state.check_deadline()
        if delay:
            await _transport.async_sleep(delay)


def wait_streaming(client: StreamingClient, job_id: str, *, timeout: float | None = None,
                   on_event: Any = None) -> Job:
    """Wait for a job through its stream; raise StreamUnavailable when the server cannot stream
    (callers then poll with Client.wait). `on_event` sees every event as it comes."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last: Job | None = None
    try:
        for event in iter_stream(client, job_id, deadline=deadline):
            if on_event is not None:
                on_event(event)
            if isinstance(event, StatusEvent):
                last = event.job
                if last.is_terminal:
                    return last
            elif isinstance(event, EndEvent) and last is not None:
                return last
    except TimeoutError:
        job = last if last is not None else client.get(job_id)
        raise WaitTimeout(job, timeout or 0.0) from None
    return last if last is not None else client.get(job_id)

