"""functions-framework entry point of the scheduler tick.

    functions-framework --source functions/scheduler_tick.py --target scheduler_tick

Adapts the framework's (flask) request to sftq_server.tick_http, which holds the logic
and answers the same way under any WSGI host. Nothing is imported or connected until the
first request: cold starts stay short, and the settings are read from the environment once.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

# functions-framework puts this folder on sys.path itself; doing it here as well keeps the
# module importable when a host loads it by path some other way.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)

if TYPE_CHECKING:
    from sftq_server.tick_http import TickApp

_app: TickApp | None = None
_lock = threading.Lock()


def _get_app() -> TickApp:
    global _app
    if _app is None:
        with _lock:
            if _app is None:
                from sftq_server.settings import get_settings
                from sftq_server.tick_http import make_tick_app

                _app = make_tick_app(get_settings())
    return _app


def scheduler_tick(request: Any) -> tuple[bytes, int, dict[str, str]]:
    """POST with `Authorization: Bearer $SFTQ_TICK_SECRET` runs one scheduler tick."""
    status, headers, body = _get_app().handle(request.method, request.headers.get("Authorization"))
    return body, status, headers
