"""functions-framework entry point of jobs-api:

    functions-framework --source functions/jobs_api.py --target jobs_api

Cold start imports almost nothing; the handler (pool, pydantic model, routes) is built on the
first request and reused by every later one in this instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sftq_server.core.lazy import Lazy

if TYPE_CHECKING:
    from sftq_server.http.web import Handler


def _build() -> Handler:
    from sftq_server.core import logs as logs
    from sftq_server.core.settings import get_settings
    from sftq_server.http.apps import make_jobs_api

    logs.configure()  # functions-framework leaves logging alone: the access log would be silent
    return make_jobs_api(get_settings())


_handler = Lazy(_build)


def jobs_api(request: Any) -> Any:
    """Serve one flask request (functions-framework hands us flask.Request)."""
    from sftq_server.http.web import handle_flask

    return handle_flask(_handler.get(), request)
