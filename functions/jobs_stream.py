"""functions-framework entry point of the live stream (GET /jobs/{id}/stream, GET /jobs/stream),
on its async stack:

    functions-framework --source functions/jobs_stream.py --target jobs_stream --asgi

Deployed beside jobs-api (functions/jobs_api.py, WSGI) as its own service: a stream holds its
connection for up to SFTQ_STREAM_MAX_SECONDS, so it wants high concurrency per instance and a
long request timeout, where the short API requests want neither. The Edge proxy sends the two
stream paths here and everything else to jobs-api (docs/operations.md).

Cold start imports almost nothing; the hub (one poll for every stream of this instance) is
built on the first request and shared by every later one.

The container image serves the same app under uvicorn (infra/deploy.sh services):

    uvicorn jobs_stream:asgi_app --factory   (PYTHONPATH=functions)
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from sftq_server.core.lazy import Lazy

if TYPE_CHECKING:
    from sftq_server.stream.hub import StreamApp


def _build() -> StreamApp:
    from sftq_server.core import logs as logs
    from sftq_server.core.settings import get_settings
    from sftq_server.stream.hub import StreamApp, make_hub

    logs.configure()  # neither functions-framework nor uvicorn sets up the access log
    return StreamApp(lambda: make_hub(get_settings()))


_app = Lazy(_build)
_log = logging.getLogger("sftq.stream")


class _Respond:
    """The stream app, ending quietly at the server's shutdown: what functions-framework's
    ASGI mode calls as the response, and what a bare ASGI server serves."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self._app(scope, receive, send)
        except asyncio.CancelledError:
            if scope.get("type") != "http":
                raise
            # A stream never ends by itself: when an instance stops, its server (uvicorn)
            # waits out its graceful-shutdown time, then cancels the streams still open, and
            # their clients resume on another instance with Last-Event-ID. That is how such a
            # stream ends, not an error to log with a traceback.
            _log.info("stream closed by the server's shutdown: %s", scope.get("path"))


async def jobs_stream(request: Any) -> Any:
    """Serve one starlette request (functions-framework --asgi hands us starlette.Request)."""
    return _Respond(_app.get())


def asgi_app() -> Any:
    """The ASGI application, for any ASGI server: `uvicorn --factory jobs_stream:asgi_app`."""
    return _Respond(_app.get())
