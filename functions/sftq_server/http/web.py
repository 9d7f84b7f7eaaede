"""A tiny HTTP layer shared by the functions: request, response, routing, errors, access log.

Framework-agnostic on purpose. The hot path (enqueue through the gateway or gunicorn) is plain
WSGI: a functions-framework/Flask stack spent about 1.9 ms of CPU per request in the web layer,
several times the cost of the database call it wraps. Here a request is a few attribute reads
from the WSGI environ, the database hands back the response body as JSON text that is passed
through untouched, and the JSON envelope is built only for errors.

Every error leaves through `error_response`: ``{"error": "<message>", "code": "<code>"}`` plus an
optional ``"details"``. Codes and statuses are listed in docs/errors.md.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import parse_qsl

from sftq_server.core.errors import (
    BadRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    SftqError,
)

access_log = logging.getLogger("sftq.access")
logger = logging.getLogger("sftq.web")

JSON = "application/json"
JSON_HEADERS: tuple[tuple[str, str], ...] = (("Content-Type", JSON),)


class StartResponse(Protocol):
    def __call__(self, status: str, headers: list[tuple[str, str]],
                 exc_info: Any = None, /) -> Callable[[bytes], object]: ...


WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
Handler = Callable[["Request"], "Response"]
RouteFn = Callable[..., "Response"]

_STATUS_LINES: dict[int, str] = {s.value: f"{s.value} {s.phrase}" for s in HTTPStatus}


def status_line(status: int) -> str:
    return _STATUS_LINES.get(status) or f"{status} Unknown"


class Headers(Mapping[str, str]):
    """Read-only request headers with case-insensitive names (stored lower-case)."""

    __slots__ = ("_d",)

    def __init__(self, items: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        self._d: dict[str, str] = {k.lower(): v for k, v in pairs}

    @classmethod
    def from_environ(cls, environ: Mapping[str, Any]) -> Headers:
        d: dict[str, str] = {}
        for key, value in environ.items():
            if key[:5] == "HTTP_":
                d[key[5:].replace("_", "-").lower()] = value
        # CGI keeps these two outside HTTP_*.
        ctype = environ.get("CONTENT_TYPE")
        if ctype:
            d["content-type"] = ctype
        clen = environ.get("CONTENT_LENGTH")
        if clen:
            d["content-length"] = clen
        headers = cls.__new__(cls)
        headers._d = d
        return headers

    def __getitem__(self, name: str) -> str:
        return self._d[name.lower()]

    def get(self, name: str, default: Any = None) -> Any:
        return self._d.get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._d

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __repr__(self) -> str:
        # Never print Authorization: reprs end up in logs and tracebacks.
        return f"Headers({sorted(self._d)})"


class Request:
    """One HTTP request. The body is read on demand, capped (see `read_body`)."""

    __slots__ = ("method", "path", "query_string", "headers", "remote_addr", "script_name",
                 "_query", "_repeated", "_body", "_stream", "_terminated", "user", "job_id")

    def __init__(self, method: str, path: str, *, query_string: str = "",
                 headers: Headers | Mapping[str, str] | None = None, body: bytes | None = None,
                 stream: Any = None, input_terminated: bool = False, remote_addr: str = "",
                 script_name: str = "") -> None:
        self.method = method.upper()
        self.path = path
        self.query_string = query_string
        if headers is None:
            headers = Headers()
        elif not isinstance(headers, Headers):
            headers = Headers(headers)
        self.headers: Headers = headers
        self.remote_addr = remote_addr
        # Where the function is mounted (e.g. /functions/v1/jobs-api), for Location and Link.
        self.script_name = script_name
        self._query: dict[str, str] | None = None
        self._repeated: frozenset[str] = frozenset()
        self._body = body
        self._stream = stream
        self._terminated = input_terminated
        # Filled in by handlers for the access log.
        self.user: str | None = None
        self.job_id: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, Any], *, stream: Any = None) -> Request:
        return cls(
            environ.get("REQUEST_METHOD", "GET"),
            environ.get("PATH_INFO", "") or "",
            query_string=environ.get("QUERY_STRING", "") or "",
            headers=Headers.from_environ(environ),
            stream=stream if stream is not None else environ.get("wsgi.input"),
            input_terminated=bool(environ.get("wsgi.input_terminated")),
            remote_addr=environ.get("REMOTE_ADDR", "") or "",
            script_name=environ.get("SCRIPT_NAME", "") or "",
        )

    @property
    def query(self) -> dict[str, str]:
        """Query parameters (last value wins; `repeated_params` names any given twice)."""
        if self._query is None:
            if not self.query_string:
                self._query = {}
            else:
                pairs = parse_qsl(self.query_string, keep_blank_values=True)
                self._query = dict(pairs)
                if len(self._query) != len(pairs):
                    seen: set[str] = set()
                    repeated: set[str] = set()
                    for key, _ in pairs:
                        (repeated if key in seen else seen).add(key)
                    self._repeated = frozenset(repeated)
        return self._query

    @property
    def repeated_params(self) -> frozenset[str]:
        _ = self.query
        return self._repeated

    def read_body(self, limit: int) -> bytes:
        """The body, at most `limit` bytes: a larger declared Content-Length is refused before
        reading anything, and an undeclared length is read only up to limit + 1 bytes."""
        if self._body is not None:
            if len(self._body) > limit:
                raise too_large(limit)
            return self._body
        length = declared_length(self.headers, limit)
        if length is not None:
            data = _read_exactly(self._stream, length)
        elif self._terminated and self._stream is not None:
            # Chunked or otherwise self-delimited: cap the read, not the declared size.
            data = _read_exactly(self._stream, limit + 1)
            if len(data) > limit:
                raise too_large(limit)
        else:
            # PEP 3333: without a length the input must not be read (it could block forever).
            data = b""
        self._body = data
        return data


def declared_length(headers: Headers, limit: int) -> int | None:
    """The body's Content-Length, if declared; refused when malformed or over `limit`."""
    raw: str | None = headers.get("content-length")
    if raw is None:
        return None
    raw = raw.strip()
    if not raw.isdigit() or len(raw) > 18:
        raise BadRequest("Content-Length is not a valid number")
    length = int(raw)
    if length > limit:
        raise too_large(limit)
    return length


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body is larger than {limit} bytes")


def _read_exactly(stream: Any, n: int) -> bytes:
    if stream is None or n <= 0:
        return b""
    data: bytes = stream.read(n)
    if len(data) < n:
        chunks = [data]
        got = len(data)
        while got < n:
            more: bytes = stream.read(n - got)
            if not more:
                break
            chunks.append(more)
            got += len(more)
        data = b"".join(chunks)
    return data


class Response:
    """Status, headers and a finished body; Content-Length is added on the way out.

    A response may instead carry `stream`, an iterable of byte chunks sent as they are
    produced (no Content-Length: HTTP/1.1 servers send it chunked). The status and headers
    are final before the first chunk, so a streaming handler does everything that can fail
    with an error status first."""

    __slots__ = ("status", "headers", "body", "stream")

    def __init__(self, status: int, body: bytes = b"",
                 headers: list[tuple[str, str]] | None = None,
                 stream: Iterable[bytes] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers: list[tuple[str, str]] = headers if headers is not None else []
        self.stream = stream

    def header(self, name: str) -> str | None:
        low = name.lower()
        for key, value in self.headers:
            if key.lower() == low:
                return value
        return None

    def json(self) -> Any:
        return json.loads(self.body)


def json_response(status: int, text: str, headers: Iterable[tuple[str, str]] = ()) -> Response:
    """A response whose body is JSON text already (as the procedures answer it)."""
    return Response(status, text.encode(), [*JSON_HEADERS, *headers])


def error_body(message: str, code: str, details: Any = None) -> bytes:
    body: dict[str, Any] = {"error": message, "code": code}
    if details is not None:
        body["details"] = details
    return json.dumps(body, default=str).encode()


def error_response(exc: BaseException) -> Response:
    """The one place an exception becomes an HTTP answer.

    A typed error keeps its status, code, message and headers. Anything else is a bug on our
    side: 500 `internal` with a generic message (the caller logs the traceback), so no query,
    payload or secret in an exception message reaches the client.
    """
    if isinstance(exc, SftqError):
        status, code, message = exc.status, exc.code, exc.message
        headers = [*JSON_HEADERS, *exc.headers.items()]
        if status == 401 and "WWW-Authenticate" not in exc.headers:
            headers.append(("WWW-Authenticate", "Bearer"))
        elif status == 503 and "Retry-After" not in exc.headers:
            headers.append(("Retry-After", "5"))
        if status >= 500 and code == "internal":
            message = "internal server error"
        return Response(status, error_body(message, code, exc.detail), headers)
    return Response(500, error_body("internal server error", "internal"), list(JSON_HEADERS))


class Route:
    __slots__ = ("template", "segments", "handlers", "allow")

    def __init__(self, template: str) -> None:
        self.template = template
        # None marks a {param} segment.
        self.segments: tuple[str | None, ...] = tuple(
            None if s.startswith("{") else s for s in template.strip("/").split("/"))
        self.handlers: dict[str, RouteFn] = {}
        self.allow = ""


class Router:
    """Exact paths by dict lookup; templates with {params} tried in the order added, and a
    static segment always beats a parameter (so /jobs/analytics/queue is never /jobs/{id}/...)."""

    def __init__(self) -> None:
        self._static: dict[str, Route] = {}
        self._dynamic: list[Route] = []
        self._by_template: dict[str, Route] = {}

    def add(self, method: str, template: str, fn: RouteFn) -> None:
        route = self._by_template.get(template)
        if route is None:
            route = self._by_template[template] = Route(template)
            if None in route.segments:
                self._dynamic.append(route)
            else:
                self._static["/" + "/".join(s for s in route.segments if s)] = route
        route.handlers[method.upper()] = fn
        route.allow = ", ".join(sorted(route.handlers))

    def match(self, path: str) -> tuple[Route, tuple[str, ...]] | None:
        route = self._static.get(path)
        if route is not None:
            return route, ()
        parts = path.strip("/").split("/")
        n = len(parts)
        for route in self._dynamic:
            segs = route.segments
            if len(segs) != n:
                continue
            params: list[str] = []
            for seg, part in zip(segs, parts, strict=True):
                if seg is None:
                    if not part:
                        break
                    params.append(part)
                elif seg != part:
                    break
            else:
                return route, tuple(params)
        return None

    @property
    def routes(self) -> list[Route]:
        return list(self._by_template.values())


class App:
    """Routes a Request to a handler; maps every exception; writes one access-log line."""

    def __init__(self, router: Router, *, name: str, mount_prefix: str = "") -> None:
        self.router = router
        self.name = name
        # When a platform forwards the full public path (/functions/v1/<name>/...), strip it.
        self.mount_prefix = mount_prefix.rstrip("/")

    def __call__(self, request: Request) -> Response:
        started = time.perf_counter()
        template = "-"
        try:
            path = request.path
            prefix = self.mount_prefix
            if prefix and path.startswith(prefix) and path[len(prefix):][:1] in ("", "/"):
                request.script_name += prefix
                path = request.path = path[len(prefix):]
            if len(path) > 1 and path[-1] == "/":
                path = path.rstrip("/") or "/"
            found = self.router.match(path)
            if found is None:
                raise NotFound("no such route")
            route, params = found
            template = route.template
            fn = route.handlers.get(request.method)
            if fn is None:
                raise MethodNotAllowed(
                    f"{request.method} is not allowed here; allowed: {route.allow}",
                    headers={"Allow": route.allow})
            response = fn(request, *params)
        except Exception as exc:
            response = self.failed(request, template, exc)
        self.log_access(request, template, response.status, started)
        return response

    def failed(self, request: Request, template: str, exc: Exception) -> Response:
        """The answer to a handler's exception; logged when the fault is ours."""
        if isinstance(exc, SftqError):
            if exc.status >= 500 and exc.code == "internal":
                logger.error("%s %s %s failed: %s", self.name, request.method, template,
                             exc.message, exc_info=exc)
        else:
            # Type and traceback only: the request body and headers stay out of the log.
            logger.error("%s %s %s failed", self.name, request.method, template, exc_info=exc)
        return error_response(exc)

    def log_access(self, request: Request, template: str, status: int, started: float) -> None:
        """The request's one line on sftq.access (`started` from time.perf_counter())."""
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(json.dumps({
                "fn": self.name,
                "method": request.method,
                "route": template,
                "status": status,
                "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                "user": request.user,
                "job_id": request.job_id,
            }))


def wsgi_app(handler: Handler) -> WSGIApp:
    """A WSGI callable around a handler."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            response = handler(Request.from_environ(environ))
        except Exception as exc:  # handlers map their own errors; this is the last resort
            logger.exception("unhandled error")
            response = error_response(exc)
        if response.stream is not None:
            start_response(status_line(response.status), list(response.headers))
            return response.stream
        body = response.body
        start_response(status_line(response.status),
                       [*response.headers, ("Content-Length", str(len(body)))])
        # A list, not another iterable: granian writes a list's bytes at once, and walks
        # anything else through an iterator wrapper, calling back into Python for each step.
        return [body]

    return app


def handle_flask(handler: Handler, flask_request: Any
                 ) -> tuple[bytes | Iterable[bytes], int, list[tuple[str, str]]]:
    """Serve a flask/functions-framework request with a handler; Flask turns the tuple into a
    response (an iterable body becomes a streamed one). The environ is the same WSGI environ,
    so nothing here depends on Flask."""
    request = Request.from_environ(flask_request.environ, stream=flask_request.stream)
    # werkzeug's stream is already limited to Content-Length; mark it safe to read to the end.
    request._terminated = True
    response = handler(request)
    body = response.body if response.stream is None else response.stream
    return body, response.status, response.headers


def simple_app(status: int, message: str, code: str,
               headers: Iterable[tuple[str, str]] = ()) -> WSGIApp:
    """A WSGI app that answers every request with one error envelope (placeholders, 404s)."""
    body = error_body(message, code)
    all_headers = [*JSON_HEADERS, *headers, ("Content-Length", str(len(body)))]
    line = status_line(status)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start_response(line, list(all_headers))
        return [body]

    return app
