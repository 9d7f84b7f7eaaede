"""functions-framework entry point of the scheduler tick.

    functions-framework --source functions/scheduler_tick.py --target scheduler_tick

Adapts the framework's (flask) request to sftq_server.scheduler.http, which holds the logic
and answers the same way under any WSGI host. Nothing is imported or connected until the
first request: cold starts stay short, and the settings are read from the environment once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

# functions-framework puts this folder on sys.path itself; doing it here as well keeps the
# module importable when a host loads it by path some other way.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)

from sftq_server.core.lazy import Lazy  # noqa: E402 - after the sys.path fix above

if TYPE_CHECKING:
    from sftq_server.scheduler.http import TickApp


def _build() -> TickApp:
    from sftq_server.core import logs as logs
    from sftq_server.core.settings import get_settings
    from sftq_server.scheduler.http import make_tick_app

    logs.configure()  # functions-framework leaves logging alone: the tick's lines would be lost
    return make_tick_app(get_settings())


_app = Lazy(_build)


def _refuse_a_weak_secret() -> None:
    # A host starts the function by importing this module: a tick secret that is too short
    # stops it here, with the reason in the log, rather than guarding the tick weakly.
    from sftq_server.core.settings import get_settings
    from sftq_server.core.tick_secret import require_tick_secret

    require_tick_secret(get_settings())


_refuse_a_weak_secret()


def scheduler_tick(request: Any) -> tuple[bytes, int, dict[str, str]]:
    """POST with `Authorization: Bearer $SFTQ_TICK_SECRET` runs one scheduler tick (its body:
    {} a tick, {"wake": true} a woken tick, {"pass": "reconcile"} a reconcile pass)."""
    status, headers, body = _app.get().handle(request.method, request.headers.get("Authorization"),
                                              request.stream.read(4096))
    return body, status, headers
