"""functions-framework entry point of jobs-api:

    functions-framework --source functions/jobs_api.py --target jobs_api

Cold start imports almost nothing; the handler (pool, pydantic model, routes) is built on the
first request and reused by every later one in this instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sftq_server.lazy import Lazy

if TYPE_CHECKING:
    from sftq_server.web import Handler


def _build() -> Handler:
    from sftq_server import logs
    from sftq_server.api import make_jobs_api
    from sftq_server.settings import get_settings

    logs.configure()  # functions-framework leaves logging alone: the access log would be silent
    return make_jobs_api(get_settings())


_handler = Lazy(_build)


def jobs_api(request: Any) -> Any:
    """Serve one flask request (functions-framework hands us flask.Request)."""
    from sftq_server.web import handle_flask

    return handle_flask(_handler.get(), request)
