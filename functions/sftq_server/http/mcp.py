"""The MCP tools over Streamable HTTP: ``$SUPABASE_URL/functions/v1/mcp``.

Thin on purpose: the tools are sftq_client.mcp's, written over the client; this module only
authenticates and hands each request to the mcp package's Streamable HTTP transport.

- Stateless (any instance answers any request, as every function here): each POST carries one
  JSON-RPC message and is answered on its own (an SSE stream while a tool reports progress).
- Each request acts as the user of the bearer key in its own Authorization header: the tools
  run with a client made from that very key, against jobs-api, which checks it as it checks any
  request. There is no other identity, so there is no cross-user access: another user's job id
  answers the tool error not_found. A request without a well-formed key is refused with 401
  before any MCP work, and so is an `initialize` whose key jobs-api does not accept.
- In `sftq dev` the jobs-api calls go to the gateway in-process (no socket, no second HTTP
  parse); deployed on its own (functions/mcp_api.py), to jobs-api's URL.

`McpHttpApp` is the ASGI application; `WsgiMcp` runs it for the WSGI gateway on an event loop
thread of its own, streaming each answer back as it is produced.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import re
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
import pydantic_core

from sftq_server.db import Database
from sftq_server.http.user_limits import UserLimits, mcp_limits
from sftq_server.http.web import StartResponse, WSGIApp, simple_app, status_line

logger = logging.getLogger("sftq.mcp")
access_log = logging.getLogger("sftq.access")

# Room for the JSON-RPC envelope around the largest body jobs-api takes.
ENVELOPE_BYTES: Final = 64 * 1024
# The largest request read is this many times jobs-api's limit: a call whose
# fireworks_payload is over jobs-api's limit (but under this) still reaches the tool, and
# comes back as jobs-api's payload_too_large tool error that a client shows (a bare HTTP 413
# is only "Server returned an error response" to the official client). Past it, the request
# is refused unread with HTTP 413.
OVERSIZE_FACTOR: Final = 8
# A key jobs-api accepted is taken as accepted this long for the requests that do not call
# jobs-api themselves (initialize, tools/list, ping...): every tool call is checked by
# jobs-api again, so a revoked key fails there at once.
KEY_TTL_SECONDS: Final = 30.0
# The hosts the endpoint answers when SFTQ_MCP_ALLOWED_HOSTS is not set (any port), besides
# the host of SUPABASE_URL: a page on another site cannot reach a local server through DNS
# rebinding (the mcp package's transport security).
LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "[::1]")
_BEARER_RE: Final = re.compile(r"Bearer\s+(sftq_[A-Za-z0-9_\-]{1,200})\s*", re.IGNORECASE)
# Clients kept, one per recent key (each holds only its settings: the pool is shared).
CLIENT_CACHE: Final = 256
_JSON: Final = [(b"content-type", b"application/json")]
# Threads the endpoint's loop hands blocking database calls to, at most.
IO_THREADS: Final = 4


def transport_security(allowed_hosts: str = "", public_url: str = "") -> Any:
    """The mcp package's Host/Origin check (its DNS rebinding protection) for the hosts in
    `allowed_hosts` (SFTQ_MCP_ALLOWED_HOSTS: comma-separated `host`, `host:port` or `host:*`;
    `*` turns the check off); empty: the loopback hosts and `public_url`'s host. Origins are
    the same hosts over http and https (a request without an Origin, as every non-browser
    client sends, passes)."""
    from mcp.server.transport_security import TransportSecuritySettings

    value = allowed_hosts.strip()
    if value == "*":
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = [h.strip() for h in value.split(",") if h.strip()]
    if not hosts:
        hosts = [h for host in LOOPBACK_HOSTS for h in (host, f"{host}:*")]
        public = urlsplit(public_url.strip()).netloc.rpartition("@")[2]
        if public:
            hosts.append(public)
    origins = [f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=hosts, allowed_origins=origins)


def bearer_key(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            match = _BEARER_RE.fullmatch(value.decode("latin-1"))
            return match.group(1) if match else None
    return None


class _SharedTransport(httpx.AsyncBaseTransport):
    """One connection pool for every request's client; closing a client leaves it open."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        return None


class InProcessTransport(httpx.AsyncBaseTransport):
    """httpx requests answered by a WSGI app of this process (the gateway), on a worker
    thread, as a WSGI server would run them."""

    def __init__(self, app: WSGIApp, *, threads: int = 16) -> None:
        self._sync = httpx.WSGITransport(app=app)
        # Its own threads: the loop's default executor is small (cores + 4) and shared.
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="sftq-mcp-call")

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        sync_request = httpx.Request(request.method, request.url, headers=request.headers,
                                     content=body, extensions=request.extensions)
        # Its provider lookups count as source "mcp" (jobs.SOURCE_HEADER; a label only).
        sync_request.headers["X-Sftq-Source"] = "mcp"

        def call() -> tuple[int, httpx.Headers, bytes]:
            response = self._sync.handle_request(sync_request)
            return response.status_code, response.headers, response.read()

        loop = asyncio.get_running_loop()
        status, headers, content = await loop.run_in_executor(self._pool, call)
        return httpx.Response(status, headers=headers, content=content)

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False)


class McpHttpApp:
    """The ASGI application of ``/functions/v1/mcp``."""

    def __init__(self, jobs_api_url: str, *, transport: httpx.AsyncBaseTransport | None = None,
                 max_body_bytes: int = 1_048_576, direct: bool = True,
                 allowed_hosts: str = "", public_url: str = "",
                 limits: UserLimits | None = None) -> None:
        from mcp.server.transport_security import TransportSecurityMiddleware

        self.jobs_api_url = jobs_api_url.rstrip("/")
        # Per-user limits on tool calls and waits (http/user_limits.py); None: jobs-api's only.
        self.limits = limits
        self.direct = direct
        self._dispatch: DirectDispatch | None = None
        self._transport = _SharedTransport(transport or httpx.AsyncHTTPTransport())
        # The largest request read (see OVERSIZE_FACTOR); jobs-api refuses what is over its
        # own limit, as a tool error.
        self.max_body_bytes = max_body_bytes * OVERSIZE_FACTOR + ENVELOPE_BYTES
        self.security = transport_security(allowed_hosts, public_url)
        self._security = TransportSecurityMiddleware(self.security)
        self._managers: tuple[Any, ...] = ()
        self._clients: dict[str, Any] = {}
        self._accepted: dict[str, float] = {}  # key -> until when it is taken as accepted
        self._ready: asyncio.Future[None] | None = None
        self._stop: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None

    # ---- the per-request client ------------------------------------------------------------

    def client(self, key: str) -> Any:
        """The client acting as `key`'s user. Kept for the next requests with the same key
        (making one costs about a quarter of a short call); the key is what identifies, and
        jobs-api checks it on every call, so a revoked key fails at once all the same."""
        client = self._clients.pop(key, None)
        if client is None:
            from sftq_client import AsyncClient

            client = AsyncClient(api_key=key, base_url=self.jobs_api_url,
                                 transport=self._transport)
            if len(self._clients) >= CLIENT_CACHE:
                # The least recently used; the transport is shared, so closing is not needed.
                self._clients.pop(next(iter(self._clients)))
        self._clients[key] = client  # most recently used last
        return client

    @contextlib.asynccontextmanager
    async def _client_for(self, request: Any) -> AsyncIterator[Any]:
        headers = getattr(request, "headers", None)
        key = bearer_key(
            (k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items())
        if key is None:  # refused before the transport; kept as a guard
            raise PermissionError("no API key")
        yield self.client(key)

    # ---- the transport's lifetime ---------------------------------------------------------

    async def _start(self) -> Any:
        if self._ready is None:
            from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

            from sftq_client.mcp import build_server

            # The package logs every request at INFO; our access log already has a line each.
            logging.getLogger("mcp").setLevel(logging.WARNING)
            server = build_server(self._client_for, subscriptions=False)
            # Two ways to answer, both allowed by the transport's specification: a call that
            # asked for progress (a progressToken) gets an SSE stream that carries the
            # notifications before its result; every other request gets its result as one
            # JSON body, which saves the stream's framing and tasks (most of a short call's
            # overhead).
            self._managers = tuple(
                StreamableHTTPSessionManager(app=server, stateless=True, json_response=plain,
                                             max_request_body_size=self.max_body_bytes,
                                             security_settings=self.security)
                for plain in (False, True))
            self._dispatch = DirectDispatch(server) if self.direct else None
            loop = asyncio.get_running_loop()
            self._ready = loop.create_future()
            self._stop = asyncio.Event()
            self._runner = loop.create_task(self._run(self._managers, self._ready, self._stop))
        await asyncio.shield(self._ready)
        return self._managers

    @staticmethod
    async def _run(managers: tuple[Any, ...], ready: asyncio.Future[None],
                   stop: asyncio.Event) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                for manager in managers:
                    await stack.enter_async_context(manager.run())
                ready.set_result(None)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    async def aclose(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._runner is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._runner, 5)
        await self._transport.inner.aclose()

    # ---- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        status = 500
        rpc: str | None = None

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        key = bearer_key(scope.get("headers", ()))
        try:
            rpc = await self._serve(scope, receive, sending, key)
        finally:
            if access_log.isEnabledFor(logging.INFO):
                access_log.info(json.dumps({
                    "fn": "mcp", "method": scope.get("method"), "route": "/", "rpc": rpc,
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                    "user": key[:13] if key else None}))

    async def _serve(self, scope: Any, receive: Any, send: Any, key: str | None) -> str | None:
        """Answer one request; the JSON-RPC method it carried, for the access log.

        In this order, for every request whatever it carries: the Host and Origin check, the
        key (jobs-api must accept it, else 401), the HTTP method (only POST: the stateless
        endpoint pushes nothing on a GET stream), the size, the JSON parse (a parse error,
        deep nesting included, is JSON-RPC's -32700), then the transport or the direct
        answer. Nothing is decided from the raw text."""
        from starlette.requests import Request

        request = Request(scope)
        refusal = await self._security.validate_request(request, is_post=False)
        if refusal is not None:  # the package's plain-text 421 (Host) or 403 (Origin)
            if refusal.status_code == 421:
                await _answer(send, 421, f"this MCP endpoint does not answer the host "
                              f"{request.headers.get('host', '')[:100]!r}: call it by a name "
                              "in the server's SFTQ_MCP_ALLOWED_HOSTS", "host_not_allowed")
            else:
                await _answer(send, refusal.status_code, f"requests from the origin "
                              f"{request.headers.get('origin', '')[:100]!r} are refused: only "
                              "pages of the hosts in SFTQ_MCP_ALLOWED_HOSTS may call this "
                              "endpoint", "origin_not_allowed")
            return None
        if key is None:
            await _answer(send, 401, "missing or malformed API key: send Authorization: "
                          "Bearer sftq_...", "unauthorized",
                          [(b"www-authenticate", b'Bearer realm="finetune-queue"')])
            return None
        accepted = await self._key_accepted(key)
        if accepted is None:
            await _answer(send, 503, "could not check the API key: jobs-api did not answer; "
                          "try again shortly", "unavailable", [(b"retry-after", b"5")])
            return None
        if not accepted:
            await _answer(send, 401, "the API key was not accepted (unknown, revoked, or its "
                          "user is disabled)", "unauthorized",
                          [(b"www-authenticate", b'Bearer realm="finetune-queue"')])
            return None
        if scope.get("method") != "POST":
            await _answer(send, 405, "this endpoint is stateless and sends nothing on a GET "
                          "stream: send each JSON-RPC message as a POST", "method_not_allowed",
                          [(b"allow", b"POST")])
            return None
        body, receive = await _buffered(receive, self.max_body_bytes)
        if body is None:
            await _answer(send, 413, f"request body over {self.max_body_bytes} bytes",
                          "payload_too_large")
            return None
        try:
            message = pydantic_core.from_json(body)
        except ValueError as exc:  # not JSON, or nested past the parser's recursion limit
            await _parse_error(send, str(exc))
            return None
        rpc = _rpc_method(message)
        async with mcp_limits(self.limits, key, rpc, message) as limited:  # rate, wait slots
            if limited is not None:
                await send({"type": "http.response.start", "status": 200, "headers": [
                    *_JSON, (b"content-length", str(len(limited)).encode())]})
                await send({"type": "http.response.body", "body": limited})
                return rpc
            streaming, plain = await self._start()
            if _wants_progress(message):
                await streaming.handle_request(scope, receive, send)
            elif self._dispatch is None or not await self._dispatch.answer(scope, message, send):
                await plain.handle_request(scope, receive, send)
        return rpc

    async def _key_accepted(self, key: str) -> bool | None:
        """Whether jobs-api accepts the key (a cached yes for KEY_TTL_SECONDS); None when
        jobs-api could not be asked (down, or failing): the request is not answered then."""
        from sftq_client import (
            APIConnectionError,
            AsyncClient,
            ServerError,
            SftqError,
            Unauthorized,
        )

        now = time.monotonic()
        if self._accepted.get(key, 0.0) > now:
            return True
        checker = AsyncClient(api_key=key, base_url=self.jobs_api_url,
                              transport=self._transport, max_retries=0, timeout=10)
        try:
            await checker.list_jobs(limit=1)
        except Unauthorized:
            self._accepted.pop(key, None)
            self._clients.pop(key, None)
            return False
        except (APIConnectionError, ServerError) as exc:
            logger.warning("could not check an API key: %s", exc)
            return None
        except SftqError as exc:  # jobs-api answered, and not 401/403: the key was taken
            logger.warning("odd answer while checking an API key: %s", exc)
        finally:
            await checker.aclose()
        if len(self._accepted) >= CLIENT_CACHE:
            for old in [k for k, until in self._accepted.items() if until <= now] or [
                    next(iter(self._accepted))]:
                self._accepted.pop(old, None)
        self._accepted[key] = now + KEY_TTL_SECONDS
        return True


class DirectDispatch:
    """A stateless request answered as one JSON body, without the transport's per-request
    machinery.

    For each stateless request the package's transport makes a transport object, a server
    session, two task groups and four memory streams, and passes the message through them to
    the server's handler and its answer back: about two thirds of a short tool call's
    overhead (docs/performance.md). Most requests here are a plain `tools/call`, so `answer`
    takes exactly the steps the transport and the session take for one (the same header
    checks, the package's own types and validation, the server's own handler and request
    context, the same JSON-RPC answer) and nothing else. Every request it does not take on as
    it stands (initialize, notifications, a progress token, a header or body the transport
    would refuse, a method without a handler) goes to the transport, which answers it as
    always; tests/mcp/test_mcp_direct.py checks that both ways answer alike."""

    def __init__(self, server: Any) -> None:
        import mcp.types as types
        from mcp.server.lowlevel.server import request_ctx
        from mcp.shared.context import RequestContext
        from mcp.shared.exceptions import McpError
        from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS
        from starlette.requests import Request

        self.server = server
        self.types = types
        self.request_ctx = request_ctx
        self.default_version = types.DEFAULT_NEGOTIATED_VERSION
        self.context = RequestContext
        self.mcp_error = McpError
        self.versions = frozenset(SUPPORTED_PROTOCOL_VERSIONS)
        self.request = Request

    def _headers_pass(self, scope: Any) -> bool:
        """The transport's checks of a JSON-mode POST (Accept, Content-Type, the protocol
        version); a request that fails one is the transport's to refuse."""
        if scope.get("method") != "POST":
            return False
        first: dict[bytes, bytes] = {}
        for name, value in scope.get("headers", ()):
            first.setdefault(name.lower(), value)
        accept = first.get(b"accept", b"").decode("latin-1")
        if not any(part.strip().startswith("application/json") for part in accept.split(",")):
            return False
        content_type = first.get(b"content-type", b"").decode("latin-1")
        if not content_type.lower().startswith("application/json") or "application/json" not in [
                part.strip() for part in content_type.split(";")[0].split(",")]:
            return False
        version = first.get(b"mcp-protocol-version")
        return (version.decode("latin-1") if version is not None
                else self.default_version) in self.versions

    async def answer(self, scope: Any, parsed: Any, send: Any) -> bool:
        """Answer the request (its body already parsed as JSON) and say True, or say False
        and send nothing."""
        types = self.types
        if not self._headers_pass(scope):
            return False
        try:
            message = types.JSONRPCMessage.model_validate(parsed)
            root = message.root
            if not isinstance(root, types.JSONRPCRequest) or root.method == "initialize":
                return False
            request = types.ClientRequest.model_validate(
                root.model_dump(by_alias=True, mode="json", exclude_none=True)).root
        except ValueError:  # a parse or validation error: the transport's answer
            return False
        meta = request.params.meta if request.params is not None else None
        handler = self.server.request_handlers.get(type(request))
        if handler is None or (meta is not None and meta.progressToken is not None):
            return False
        # No session: a request without a progress token sends nothing but its answer.
        token = self.request_ctx.set(self.context(
            root.id, meta, None, {}, request=self.request(scope)))  # type: ignore[arg-type]
        try:
            response = await handler(request)
        except self.mcp_error as err:
            response = err.error
        except Exception as err:  # as the server answers a handler's failure
            logger.warning("MCP handler failed", exc_info=True)
            response = types.ErrorData(code=0, message=str(err), data=None)
        finally:
            self.request_ctx.reset(token)
        if isinstance(response, types.ErrorData):
            reply: Any = types.JSONRPCError(jsonrpc="2.0", id=root.id, error=response)
        else:
            reply = types.JSONRPCResponse(jsonrpc="2.0", id=root.id, result=response.model_dump(
                by_alias=True, mode="json", exclude_none=True))
        payload = types.JSONRPCMessage(reply).model_dump_json(
            by_alias=True, exclude_none=True).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(payload)).encode()), *_JSON]})
        await send({"type": "http.response.body", "body": payload})
        return True


def _rpc_method(message: Any) -> str | None:
    """The JSON-RPC method of a parsed message, for the access log."""
    method = message.get("method") if isinstance(message, dict) else None
    return method[:64] if isinstance(method, str) else None


def _wants_progress(message: Any) -> bool:
    """A request that carries a progress token (params._meta.progressToken): answered as an
    SSE stream that carries its progress notifications before the result."""
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and meta.get("progressToken") is not None


async def _parse_error(send: Any, detail: str) -> None:
    """JSON-RPC's parse error, as the package's transport answers one (HTTP 400)."""
    body = json.dumps({"jsonrpc": "2.0", "id": "server-error", "error": {
        "code": -32700, "message": f"Parse error: {detail[:200]}"}}).encode()
    await send({"type": "http.response.start", "status": 400,
                "headers": [*_JSON, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _buffered(receive: Any, limit: int) -> tuple[bytes | None, Any]:
    """The whole body (None past `limit`), and a receive that replays it, then waits for the
    client to go (the transport listens for a disconnect while it streams)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None, receive
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Any:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


async def _answer(send: Any, status: int, message: str, code: str,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": message, "code": code}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [*_JSON, (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


# ---- under the WSGI gateway ------------------------------------------------------------------


_DONE: Final = object()


class WsgiMcp:
    """`McpHttpApp` for a threaded WSGI server: the app lives on an event loop of its own
    thread; each request's answer is streamed back to the server thread through a queue, and
    a client that goes away is told to the app as http.disconnect."""

    def __init__(self, app: McpHttpApp) -> None:
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                # The database calls the loop hands off (the per-user limits' takes and wait
                # slots) run on a few named threads: a fixed bound, however many requests.
                loop.set_default_executor(ThreadPoolExecutor(
                    max_workers=IO_THREADS, thread_name_prefix="sftq-mcp-io"))
                thread = threading.Thread(target=loop.run_forever, name="sftq-mcp-loop",
                                          daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if (environ.get("PATH_INFO") or "/") != "/":
            return simple_app(404, "no such route: the MCP endpoint is /functions/v1/mcp",
                              "not_found")(environ, start_response)
        loop = self._start()
        limit = self.app.max_body_bytes
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > limit:
            app = simple_app(413 if length > 0 else 400, "bad or over-large Content-Length",
                             "payload_too_large" if length > 0 else "bad_request")
            return app(environ, start_response)
        body = environ["wsgi.input"].read(length) if length else b""
        out: queue.Queue[Any] = queue.Queue()
        conn = _Connection(loop)
        future = asyncio.run_coroutine_threadsafe(
            _drive(self.app, _scope(environ), body, out, conn), loop)
        future.add_done_callback(lambda f: out.put(_DONE))
        first = out.get()
        if first is _DONE or first.get("type") != "http.response.start":
            conn.close()
            exc = future.exception() if future.done() else None
            logger.error("the MCP app ended without an answer", exc_info=exc)
            return simple_app(500, "internal server error", "internal")(environ, start_response)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in first["headers"]]
        start_response(status_line(first["status"]), headers)
        return _Body(out, conn)

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.app.aclose(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(5)
        if loop.is_running():
            return  # a stuck callback: leave the daemon thread its loop rather than break it
        # As asyncio.run ends: cancel what is still pending (sse-starlette's shutdown watcher,
        # a call still streaming) and let it finish, or closing the loop destroys those tasks
        # pending ("Task was destroyed but it is pending!" on every stop).
        while tasks := [t for t in asyncio.all_tasks(loop) if not t.done()]:
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


class _Connection:
    """One request's link between the server thread and the loop: close() on the server
    thread (the client left, or the answer is done) becomes http.disconnect on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.gone = threading.Event()
        self.disconnected: asyncio.Event | None = None

    def opened(self) -> asyncio.Event:  # on the loop
        self.disconnected = asyncio.Event()
        if self.gone.is_set():
            self.disconnected.set()
        return self.disconnected

    def close(self) -> None:  # on the server thread
        self.gone.set()
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            self.loop.call_soon_threadsafe(self._set)

    def _set(self) -> None:
        if self.disconnected is not None:
            self.disconnected.set()


async def _drive(app: McpHttpApp, scope: dict[str, Any], body: bytes, out: queue.Queue[Any],
                 conn: _Connection) -> None:
    disconnected = conn.opened()
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if disconnected.is_set() and message["type"] == "http.response.body":
            raise OSError("the client went away")
        out.put(message)

    await app(scope, receive, send)


class _Body:
    """The WSGI body: chunks as the app sends them; close() (the client left, or the answer
    is done) tells the app."""

    def __init__(self, out: queue.Queue[Any], conn: _Connection) -> None:
        self._out = out
        self._conn = conn

    def __iter__(self) -> Iterator[bytes]:
        while True:
            message = self._out.get()
            if message is _DONE:
                return
            if message.get("type") != "http.response.body":
                continue
            chunk: bytes = message.get("body", b"")
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                return

    def close(self) -> None:
        self._conn.close()


def _scope(environ: dict[str, Any]) -> dict[str, Any]:
    headers = []
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            headers.append((name[5:].replace("_", "-").lower().encode("latin-1"),
                            str(value).encode("latin-1")))
    for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(name):
            headers.append((name.replace("_", "-").lower().encode("latin-1"),
                            str(environ[name]).encode("latin-1")))
    path = (environ.get("SCRIPT_NAME", "") or "") + (environ.get("PATH_INFO", "") or "")
    server = (environ.get("SERVER_NAME", "127.0.0.1"), int(environ.get("SERVER_PORT") or 80))
    client = (environ.get("REMOTE_ADDR", "127.0.0.1"), int(environ.get("REMOTE_PORT") or 0))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": str(environ.get("SERVER_PROTOCOL", "HTTP/1.1")).split("/")[-1],
        "method": environ.get("REQUEST_METHOD", "GET"),
        "scheme": environ.get("wsgi.url_scheme", "http"),
        "path": path,
        "raw_path": path.encode("latin-1", "replace"),
        "root_path": "",
        "query_string": str(environ.get("QUERY_STRING", "")).encode("latin-1"),
        "headers": headers,
        "server": server,
        "client": client,
    }


def make_wsgi_mcp(gateway: WSGIApp, jobs_api_path: str, max_body_bytes: int, *,
                  allowed_hosts: str = "", db: Database | None = None) -> WSGIApp:
    """The MCP endpoint for the WSGI gateway, calling the gateway's own jobs-api in-process;
    503 when the mcp package is not installed."""
    try:
        import mcp  # noqa: F401
    except ModuleNotFoundError:
        logger.warning("the mcp package is not installed; /functions/v1/mcp answers 503")
        return simple_app(503, "the MCP endpoint needs the mcp extra on the server",
                          "unavailable", [("Retry-After", "30")])
    app = McpHttpApp(f"http://sftq.internal{jobs_api_path}",
                     transport=InProcessTransport(gateway), max_body_bytes=max_body_bytes,
                     allowed_hosts=allowed_hosts,
                     limits=None if db is None else UserLimits(db))
    return WsgiMcp(app)


# ---- under the RSGI gateway (the image's server) -----------------------------------------------


class RsgiMcp:
    """`McpHttpApp` on granian's RSGI interface, on the server's own event loop: no thread
    between the request and the protocol (the jobs-api calls still run the WSGI gateway on
    InProcessTransport's threads)."""

    def __init__(self, app: McpHttpApp) -> None:
        self.app = app

    async def __call__(self, scope: Any, proto: Any) -> None:
        limit = self.app.max_body_bytes
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                   for k, v in scope.headers.items()]
        declared = next((v.decode("latin-1") for k, v in headers if k == b"content-length"),
                        None)
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            proto.response_bytes(413, [("content-type", "application/json")], json.dumps(
                {"error": f"request body over {limit} bytes", "code": "payload_too_large"}
            ).encode())
            return
        chunks: list[bytes] = []
        size = 0
        async for chunk in proto:
            size += len(chunk)
            if size > limit:  # a body without a Content-Length, read only up to the limit
                proto.response_bytes(413, [("content-type", "application/json")], json.dumps(
                    {"error": f"request body over {limit} bytes", "code": "payload_too_large"}
                ).encode())
                return
            chunks.append(chunk)
        body = b"".join(chunks)
        host, _, port = scope.server.rpartition(":")
        client_host, _, client_port = scope.client.rpartition(":")
        asgi_scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": scope.http_version, "method": scope.method,
            "scheme": scope.scheme, "path": scope.path,
            "raw_path": scope.path.encode("utf-8", "surrogateescape"), "root_path": "",
            "query_string": scope.query_string.encode("latin-1"), "headers": headers,
            "server": (host, int(port or 0)), "client": (client_host, int(client_port or 0)),
        }
        sent_body = False
        status = 500
        response_headers: list[tuple[str, str]] = []
        stream: Any = None

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await proto.client_disconnect()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, response_headers, stream
            if message["type"] == "http.response.start":
                status = message["status"]
                response_headers = [(k.decode("latin-1"), v.decode("latin-1"))
                                    for k, v in message.get("headers", ())]
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                more = message.get("more_body", False)
                if stream is None and not more:
                    proto.response_bytes(status, response_headers, chunk)
                    return
                if stream is None:
                    stream = proto.response_stream(status, response_headers)
                if chunk:
                    await stream.send_bytes(chunk)

        await self.app(asgi_scope, receive, send)


def make_rsgi_mcp(gateway: WSGIApp, jobs_api_path: str, max_body_bytes: int, *,
                  allowed_hosts: str = "", db: Database | None = None) -> Any:
    """The MCP endpoint for the RSGI gateway; None when the mcp package is not installed
    (the WSGI gateway's route then answers 503)."""
    try:
        import mcp  # noqa: F401
    except ModuleNotFoundError:
        return None
    return RsgiMcp(McpHttpApp(f"http://sftq.internal{jobs_api_path}",
                              transport=InProcessTransport(gateway),
                              max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts,
                              limits=None if db is None else UserLimits(db)))
