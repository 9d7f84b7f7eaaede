"""All three functions behind one port, at the paths Supabase gives them:

    /functions/v1/jobs-api/...        jobs-api (sftq_server.http.apps.make_jobs_api); its two stream
                                      paths (/jobs/stream, /jobs/{id}/stream) live, from
                                      sftq_server.stream.hub (one poll for all open streams)
    /functions/v1/analytics/...       analytics (sftq_server.http.apps.make_analytics_api)
    /functions/v1/scheduler-tick      the scheduler tick (sftq_server.scheduler.http.make_tick_app)
    /functions/v1/mcp                 the MCP tools for agents, Streamable HTTP
                                      (sftq_server.http.mcp; loaded on its first request)

so the contract's curl lines work with SUPABASE_URL=http://127.0.0.1:<port>. The dispatch is a
prefix match that moves the prefix into SCRIPT_NAME; a bare prefix is passed on as an empty
path (the function answers 404) instead of a 308 redirect, which clients would follow without
their POST body.

Run it with `serve(host, port, settings)`, `python -m sftq_server.http.gateway`, or any WSGI server:
`gunicorn 'sftq_server.http.gateway:create_app()'`.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from sftq_server.core.settings import Settings
from sftq_server.http.apps import ApiApp, make_analytics_api, make_jobs_api
from sftq_server.http.routes.jobs import ProviderFactory
from sftq_server.http.web import StartResponse, WSGIApp, simple_app, wsgi_app
from sftq_server.stream.paths import parse_stream_path

logger = logging.getLogger("sftq.gateway")

JOBS_PREFIX = "/functions/v1/jobs-api"
ANALYTICS_PREFIX = "/functions/v1/analytics"
TICK_PREFIX = "/functions/v1/scheduler-tick"
TICK_MODULE = "sftq_server.scheduler.http"
MCP_PREFIX = "/functions/v1/mcp"


class Gateway:
    """A WSGI app dispatching by path prefix to the three functions."""

    def __init__(self, settings: Settings, *,
                 provider_factory: ProviderFactory | None = None,
                 live_streams: bool = True) -> None:
        self.settings = settings
        # Live streams hold a server thread each here: right for `sftq dev` / `sftq serve`,
        # not for a production WSGI server with a few threads (streams go to jobs-stream).
        self._live_streams = live_streams
        self._jobs = make_jobs_api(settings, provider_factory=provider_factory)
        self._analytics = make_analytics_api(settings)
        self._tick: WSGIApp | None = None
        self._tick_lock = threading.Lock()
        self._jobs_wsgi = wsgi_app(self._jobs)
        self._streams: Any = None
        self._streams_lock = threading.Lock()
        self._mcp: Any = None
        self._mcp_lock = threading.Lock()
        self._mounts: tuple[tuple[str, WSGIApp], ...] = (
            (JOBS_PREFIX, self._jobs_app),
            (ANALYTICS_PREFIX, wsgi_app(self._analytics)),
            (TICK_PREFIX, self._tick_app),
            (MCP_PREFIX, self._mcp_app),
        )
        self._not_found = simple_app(404, "no such function", "not_found")

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path: str = environ.get("PATH_INFO", "") or ""
        for prefix, app in self._mounts:
            if path.startswith(prefix):
                rest = path[len(prefix):]
                if not rest or rest[0] == "/":
                    environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + prefix
                    environ["PATH_INFO"] = rest
                    return app(environ, start_response)
        return self._not_found(environ, start_response)

    @property
    def jobs(self) -> ApiApp:
        """The jobs-api function (for the RSGI gateway's own POST /jobs)."""
        return self._jobs

    def _jobs_app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if (self._live_streams and environ.get("REQUEST_METHOD") in ("GET", "HEAD")
                and parse_stream_path(environ.get("PATH_INFO", "") or "") is not False):
            body: Iterable[bytes] = self._stream_app()(environ, start_response)
            return body
        return self._jobs_wsgi(environ, start_response)

    def _stream_app(self) -> Any:
        # Built on the first stream: its event loop thread and hub cost nothing until then.
        if self._streams is None:
            with self._streams_lock:
                if self._streams is None:
                    from sftq_server.stream.hub import WsgiStreams, make_hub

                    db = self._jobs.api.db
                    self._streams = WsgiStreams(lambda: make_hub(self.settings, db=db))
        return self._streams

    def _mcp_app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if self._mcp is None:
            with self._mcp_lock:
                if self._mcp is None:
                    from sftq_server.http.mcp import make_wsgi_mcp

                    self._mcp = make_wsgi_mcp(self, JOBS_PREFIX, self.settings.max_body_bytes,
                                              allowed_hosts=self.settings.mcp_allowed_hosts,
                                              db=self._jobs.api.db)
        body: Iterable[bytes] = self._mcp(environ, start_response)
        return body

    def _tick_app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if self._tick is None:
            with self._tick_lock:
                if self._tick is None:
                    self._tick = self._load_tick_app()
        return self._tick(environ, start_response)

    def _load_tick_app(self) -> WSGIApp:
        # Imported on first use: the tick pulls in the scheduler and the provider client,
        # which the jobs-api never needs.
        try:
            from importlib import import_module

            module = import_module(TICK_MODULE)
        except ModuleNotFoundError as exc:
            if exc.name != TICK_MODULE:
                raise
            logger.warning("%s is not installed; %s answers 503", TICK_MODULE, TICK_PREFIX)
            return simple_app(503, "the scheduler tick is not available in this deployment",
                              "unavailable", [("Retry-After", "30")])
        app: WSGIApp = module.make_tick_app(self.settings)
        return app

    def close(self) -> None:
        """Close the streams, the pools and the provider client (the process is going away)."""
        if self._streams is not None:
            self._streams.close()
        if callable(getattr(self._mcp, "close", None)):
            self._mcp.close()
        self._jobs.close()
        self._analytics.close()
        close = getattr(self._tick, "close", None)
        if callable(close):
            close()


def make_gateway(settings: Settings, *, provider_factory: ProviderFactory | None = None,
                 live_streams: bool = True) -> Gateway:
    return Gateway(settings, provider_factory=provider_factory, live_streams=live_streams)


def create_app() -> Gateway:
    """For WSGI servers: `gunicorn 'sftq_server.http.gateway:create_app()'` (settings from the env).
    Refuses to start (TickSecretError) with a tick secret too short to guard the tick.

    The two stream paths answer 501 `stream_unavailable` here (clients then poll): a WSGI
    server runs a few threads, and each open stream would hold one for up to an hour. Streams
    are served by the ASGI entry point (functions/jobs_stream.py, the jobs-stream service)."""
    from sftq_server.core import logs as logs
    from sftq_server.core.tick_secret import require_tick_secret

    logs.configure()  # no one else does under granian: the access log would stay silent
    settings = Settings.from_env()
    require_tick_secret(settings)
    return make_gateway(settings, live_streams=False)


_SERVER_ERROR_CODES = {
    400: "bad_request",
    414: "uri_too_long",
    431: "headers_too_large",
    501: "not_implemented",
    505: "http_version_not_supported",
}


def _quiet_handler() -> type[Any]:
    from werkzeug.serving import WSGIRequestHandler

    class QuietHandler(WSGIRequestHandler):
        # sftq.access already writes one line per request; werkzeug's would double it.
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass

        def send_error(self, code: int, message: str | None = None,
                       explain: str | None = None) -> None:
            # Requests the HTTP server refuses before any function runs (a header line over
            # 64 KiB, a request line it cannot parse, an unknown HTTP version) get the same
            # JSON envelope as every other error, not http.server's HTML page.
            status = HTTPStatus(code)
            body = json.dumps({"error": message or status.phrase,
                               "code": _SERVER_ERROR_CODES.get(code, "bad_request")}).encode()
            if self.request_version == "HTTP/0.9":
                self.request_version = "HTTP/1.0"  # answer with a status line all the same
            self.close_connection = True
            self.send_response(code, status.phrase)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return QuietHandler


def make_server(host: str, port: int, settings: Settings, *,
                provider_factory: ProviderFactory | None = None) -> Any:
    """A threaded werkzeug server around the gateway, bound but not yet serving.

    `server.port` is the bound port (useful with port 0); stop it with `server.shutdown()`
    from another thread, then `server.server_close()` and `server.app.close()`.
    """
    from werkzeug.serving import make_server as werkzeug_make_server

    app = make_gateway(settings, provider_factory=provider_factory)
    try:
        return werkzeug_make_server(host, port, app, threaded=True,
                                    request_handler=_quiet_handler())
    except BaseException:
        app.close()
        raise


def serve(host: str, port: int, settings: Settings, *,
          provider_factory: ProviderFactory | None = None) -> None:
    """Serve the gateway until SIGTERM or SIGINT, then close the server and the pools."""
    server = make_server(host, port, settings, provider_factory=provider_factory)
    print(f"gateway listening on http://{host}:{server.port}", flush=True)

    def stop(signum: int, frame: Any) -> None:
        # shutdown() waits for serve_forever() to return, which runs in this very thread:
        # ask from another one.
        threading.Thread(target=server.shutdown, name="gateway-shutdown", daemon=True).start()

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, stop)
    try:
        server.serve_forever()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.server_close()
        server.app.close()
        print("gateway stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sftq_server.http.gateway",
                                     description="Serve jobs-api, analytics and scheduler-tick.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    from sftq_server.core import logs as logs

    logs.configure()
    settings = Settings.from_env()
    if not settings.database_url:
        parser.error("DATABASE_URL is not set")
    serve(args.host, args.port, settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
