"""functions-framework entry point of the read-only analytics function:

    functions-framework --source functions/analytics_api.py --target analytics

It reads ANALYTICS_DATABASE_URL (a read replica is fine) and falls back to DATABASE_URL.
The handler is built on the first request, not at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sftq_server.core.lazy import Lazy

if TYPE_CHECKING:
    from sftq_server.http.web import Handler


def _build() -> Handler:
    from sftq_server.core import logs as logs
    from sftq_server.core.settings import get_settings
    from sftq_server.http.apps import make_analytics_api

    logs.configure()  # functions-framework leaves logging alone: the access log would be silent
    return make_analytics_api(get_settings())


_handler = Lazy(_build)


def analytics(request: Any) -> Any:
    """Serve one flask request (functions-framework hands us flask.Request)."""
    from sftq_server.http.web import handle_flask

    return handle_flask(_handler.get(), request)
