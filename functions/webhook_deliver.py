"""functions-framework entry point of the webhook delivery function.

    functions-framework --source functions/webhook_deliver.py --target webhook_deliver

pg_cron (every few seconds) and a pg_net trigger (right after a commit that wrote deliveries)
POST to it with `Authorization: Bearer v1.<seconds>.<hmac>`, the two-minute token of
SFTQ_TICK_SECRET that scheduler-tick accepts too (the secret itself is accepted as well, for a
person's curl); each call delivers what is due, for at most 20 s, and answers
{"attempts", "duration_ms"} (cron/schedule_webhooks.sql, docs/webhooks.md). Nothing is
imported or connected until the first request.

In the container image the same app runs under granian, as a WSGI factory:

    granian --interface wsgi --factory webhook_deliver:create_app   (PYTHONPATH=functions)

A tick secret shorter than 32 characters stops either host from starting, as it stops
scheduler-tick: the two functions are guarded by the same secret.
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
    from sftq_server.webhooks import DeliverApp


def _build() -> DeliverApp:
    from sftq_server.core import logs as logs
    from sftq_server.core.settings import get_settings
    from sftq_server.webhooks import make_deliver_app

    # Neither functions-framework nor granian sets logging up: one line per delivery outcome.
    logs.configure()
    return make_deliver_app(get_settings())


_app = Lazy(_build)


def _refuse_a_weak_secret() -> None:
    # A host starts the function by importing this module: a secret too short to guard it
    # stops it here, with the reason in the log (tick_http.require_tick_secret).
    from sftq_server.core.settings import get_settings
    from sftq_server.core.tick_secret import require_tick_secret

    require_tick_secret(get_settings())


_refuse_a_weak_secret()


def webhook_deliver(request: Any) -> tuple[bytes, int, dict[str, str]]:
    """POST with `Authorization: Bearer <the tick secret or its token>` runs one delivery pass."""
    status, headers, body = _app.get().handle(request.method, request.headers.get("Authorization"))
    return body, status, headers


def create_app() -> DeliverApp:
    """The WSGI app, for a WSGI server's factory option (the container image's granian)."""
    return _app.get()
