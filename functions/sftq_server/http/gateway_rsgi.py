"""The gateway on granian's RSGI interface: the server the image runs (Dockerfile).

    granian --interface rsgi --workers 2 --no-ws --factory sftq_server.http.gateway_rsgi:create_app

Why: POST /jobs is the hot path, and its requests are written in batches (group commit). Under
WSGI each request held a blocking thread, and the requests of a batch handed the interpreter
lock and the batch to each other: about ten thread switches per request, a third of the
server's CPU (docs/performance.md). Here POST /jobs waits as a coroutine on the process's
event loop, and the batches go out from that same thread over a connection of their own
(group_commit.AsyncGroupCommit), with the same statement, retries and answers as under WSGI.

Every other request goes to the WSGI gateway (gateway.py) on a pool of threads, as a WSGI
server would run it: the same routes, checks, errors and access log. Its body is read only
when the route reads it and only as far as the route allows, and a streamed answer (a long
GET /jobs) is sent chunk by chunk as the thread produces it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sftq_server.core.errors import BadRequest
from sftq_server.core.settings import Settings
from sftq_server.http.apps import ApiApp
from sftq_server.http.gateway import JOBS_PREFIX, MCP_PREFIX, Gateway
from sftq_server.http.group_commit import AsyncGroupCommit
from sftq_server.http.routes.jobs import created, is_direct, submit_headers, submit_params
from sftq_server.http.web import (
    JSON_HEADERS,
    Headers,
    Request,
    WSGIApp,
    declared_length,
    error_body,
    too_large,
)

logger = logging.getLogger("sftq.gateway")

SUBMIT_PATH = f"{JOBS_PREFIX}/jobs"
_NO_MORE = object()


def header_dict(scope: Any) -> dict[str, str]:
    """The request's headers, lower-case names; a repeated header's values joined by commas
    (RFC 9110 5.3), as a WSGI server joins them."""
    headers: dict[str, str] = {}
    for name, value in scope.headers.items():
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers


async def read_body(proto: Any, headers: Headers, limit: int) -> bytes:
    """The body, at most `limit` bytes: a larger Content-Length is refused before reading, and
    a body without one (chunked) is refused as soon as it passes the limit."""
    length = declared_length(headers, limit)
    try:
        if length is not None:
            data: bytes = await proto() if length else b""
            return data
        chunks: list[bytes] = []
        got = 0
        async for chunk in proto:
            got += len(chunk)
            if got > limit:
                raise too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)
    except (ConnectionError, RuntimeError) as exc:  # granian's ProtocolClosed is a RuntimeError
        raise BadRequest("the request body ended before its end") from exc


class _BodyReader:
    """wsgi.input for a bridged request: read from a worker thread, fetched chunk by chunk from
    the event loop only as far as the route reads."""

    def __init__(self, proto: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._proto = proto
        self._loop = loop
        self._chunks: Any = None
        self._buffer = bytearray()
        self._ended = False

    async def _next_chunk(self) -> bytes:
        if self._chunks is None:
            self._chunks = self._proto.__aiter__()
        try:
            chunk: bytes = await self._chunks.__anext__()
        except StopAsyncIteration:
            return b""
        return chunk

    def _fill(self, wanted: int) -> None:
        while not self._ended and (wanted < 0 or len(self._buffer) < wanted):
            try:
                chunk = asyncio.run_coroutine_threadsafe(self._next_chunk(), self._loop).result()
            except (ConnectionError, RuntimeError):  # the client went away mid-body
                chunk = b""
            if chunk:
                self._buffer += chunk
            else:
                self._ended = True

    def read(self, size: int = -1) -> bytes:
        self._fill(size)
        n = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def readline(self, size: int = -1) -> bytes:
        while b"\n" not in self._buffer and not self._ended:
            self._fill(len(self._buffer) + 1)
        end = self._buffer.find(b"\n") + 1 or len(self._buffer)
        return self.read(end if size < 0 else min(size, end))

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")


def wsgi_environ(scope: Any, body: Any) -> dict[str, Any]:
    host, _, port = scope.server.rpartition(":")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope.method,
        "SCRIPT_NAME": "",
        # PEP 3333: the decoded path's bytes, one character per byte.
        "PATH_INFO": scope.path.encode("utf-8", "surrogateescape").decode("latin-1"),
        "QUERY_STRING": scope.query_string,
        "SERVER_NAME": host,
        "SERVER_PORT": port,
        "SERVER_PROTOCOL": f"HTTP/{scope.http_version}",
        "REMOTE_ADDR": scope.client.rpartition(":")[0],
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.scheme,
        "wsgi.input": body,
        "wsgi.input_terminated": True,  # the reader ends where the body ends
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    for name, value in header_dict(scope).items():
        if name == "content-type":
            environ["CONTENT_TYPE"] = value
        elif name == "content-length":
            environ["CONTENT_LENGTH"] = value
        else:
            environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ


class WsgiBridge:
    """Serves RSGI requests with a WSGI app on a thread pool."""

    def __init__(self, app: WSGIApp, executor: ThreadPoolExecutor) -> None:
        self._app = app
        self._executor = executor

    async def __call__(self, scope: Any, proto: Any) -> None:
        loop = asyncio.get_running_loop()
        environ = wsgi_environ(scope, _BodyReader(proto, loop))
        started: list[Any] = []
        try:
            result, chunks, first = await loop.run_in_executor(
                self._executor, self._start, environ, started)
        except Exception:  # the app broke the WSGI protocol (wsgi_app maps its own errors)
            logger.exception("the WSGI app failed on %s", scope.method)
            proto.response_bytes(500, list(JSON_HEADERS),
                                 error_body("internal server error", "internal"))
            return
        status, headers = int(started[0][:3]), started[1]
        if chunks is None:
            proto.response_bytes(status, headers, b"".join(result))
            return
        try:
            if first is _NO_MORE:
                proto.response_bytes(status, headers, b"")
                return
            transport = proto.response_stream(status, headers)
            chunk = first
            while chunk is not _NO_MORE:
                if chunk:
                    await transport.send_bytes(chunk)
                chunk = await loop.run_in_executor(self._executor, next, chunks, _NO_MORE)
        except (ConnectionError, RuntimeError):  # the client went away: stop producing
            pass
        finally:
            close: Callable[[], object] | None = getattr(result, "close", None)
            if close is not None:  # PEP 3333: once the answer is sent, or abandoned
                await loop.run_in_executor(self._executor, close)

    def _start(self, environ: dict[str, Any], started: list[Any]
               ) -> tuple[Iterable[bytes], Iterator[bytes] | None, Any]:
        """In a thread: call the app. A finished body (a list) comes back whole; any other as
        its iterator and first chunk, since a WSGI app may start its response only when its
        body is first iterated."""
        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Callable[[bytes], object]:
            if exc_info is not None and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return _no_write

        result: Iterable[bytes] = self._app(environ, start_response)
        if isinstance(result, list):
            return result, None, None
        chunks = iter(result)
        try:
            return result, chunks, next(chunks, _NO_MORE)
        except BaseException:
            close = getattr(result, "close", None)
            if close is not None:
                close()
            raise


def _no_write(data: bytes) -> object:
    raise NotImplementedError("write() is not supported: return the body instead")


class RsgiGateway:
    """The RSGI app: POST {JOBS_PREFIX}/jobs on the event loop, everything else bridged to
    the WSGI gateway. granian calls __rsgi_init__ and __rsgi_del__ in each worker."""

    def __init__(self, gateway: Gateway, *, threads: int = 8) -> None:
        self.gateway = gateway
        self._jobs: ApiApp = gateway.jobs
        self._max_body = self._jobs.api.max_body
        self._threads = max(1, threads)
        self._executor: ThreadPoolExecutor | None = None
        self._bridge: WsgiBridge | None = None
        # The MCP endpoint on this loop (sftq_server.http.mcp), made on its first request.
        self._mcp: Any = None
        settings = gateway.settings
        self.group_commit = AsyncGroupCommit(
            settings.database_url, default_queue_timeout=settings.queue_timeout_seconds,
            max_batch=settings.group_commit_max, linger=settings.group_commit_linger_ms / 1000,
            timeout=settings.db_timeout_seconds)

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="sftq-wsgi")
        self._bridge = WsgiBridge(self.gateway, self._executor)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        # granian calls this once its loop has stopped serving.
        if not loop.is_closed() and not loop.is_running():
            loop.run_until_complete(self.group_commit.close())
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self.gateway.close()

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":  # websockets: the image runs granian with --no-ws
            return
        if self._bridge is None:
            self.__rsgi_init__(asyncio.get_running_loop())
        if scope.method == "POST" and scope.path == SUBMIT_PATH:
            await self._submit(scope, proto)
        elif scope.path in (MCP_PREFIX, MCP_PREFIX + "/") and self._mcp_app() is not None:
            await self._mcp(scope, proto)
        else:
            assert self._bridge is not None
            await self._bridge(scope, proto)

    def _mcp_app(self) -> Any:
        if self._mcp is None:
            from sftq_server.http.mcp import make_rsgi_mcp

            self._mcp = make_rsgi_mcp(
                self.gateway, JOBS_PREFIX, self._max_body,
                allowed_hosts=self.gateway.settings.mcp_allowed_hosts,
                db=self._jobs.api.db) or False
        return self._mcp or None

    async def _submit(self, scope: Any, proto: Any) -> None:
        """POST /jobs as JobsApi.submit answers it, with the body and the batch awaited."""
        started = time.perf_counter()
        request = Request("POST", "/jobs", query_string=scope.query_string,
                          headers=Headers(header_dict(scope)),
                          remote_addr=scope.client.rpartition(":")[0], script_name=JOBS_PREFIX)
        try:
            key_hash, idem = submit_headers(request)
            body = await read_body(proto, request.headers, self._max_body)
            params, pre = submit_params(key_hash, idem, body, self.gateway.settings.preflight)
            loop = asyncio.get_running_loop()
            api = self._jobs.api.jobs
            if pre.outcome == "pending" and api.can_ask_provider():
                # The provider checks block for their budget at most: on a worker thread.
                await loop.run_in_executor(self._executor, api.check_resources, pre)
            if is_direct(pre):  # "after" or "max_run_seconds": alone, on a worker thread
                answer = await loop.run_in_executor(self._executor, api.submit_direct,
                                                    params, pre)
            else:
                answer = await self.group_commit.submit(params)
            if pre.to_record:
                await loop.run_in_executor(self._executor, api.record_preflight,
                                           key_hash, answer, pre)
            response = created(request, answer, pre)
        except Exception as exc:
            response = self._jobs.failed(request, "/jobs", exc)
        self._jobs.log_access(request, "/jobs", response.status, started)
        proto.response_bytes(response.status, response.headers, response.body)


def make_rsgi_gateway(settings: Settings, gateway: Gateway) -> RsgiGateway:
    return RsgiGateway(gateway, threads=settings.gateway_threads)


def create_app() -> RsgiGateway:
    """For granian: `granian --interface rsgi --factory sftq_server.http.gateway_rsgi:create_app`
    (settings from the environment; refuses to start with a tick secret under 32 characters)."""
    from sftq_server.http.gateway import create_app as create_wsgi_gateway

    gateway = create_wsgi_gateway()
    return make_rsgi_gateway(gateway.settings, gateway)
