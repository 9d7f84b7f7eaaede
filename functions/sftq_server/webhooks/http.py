"""The webhook-deliver function (production: fired by pg_cron through pg_net): one bounded
run of the deliverer per request, guarded by the tick secret."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from sftq_server.core.errors import SftqError
from sftq_server.webhooks.deliverer import Deliverer

if TYPE_CHECKING:

    from sftq_server.core.settings import Settings
    from sftq_server.db import Database

logger = logging.getLogger("sftq.webhooks")



class DeliverApp:
    """POST with the tick secret runs one delivery pass: until nothing is due, at most
    `budget_seconds`. pg_cron fires it every few seconds and a pg_net trigger right after a
    commit that wrote deliveries (cron/schedule_webhooks.sql); overlapping passes share the work
    through the claim's SKIP LOCKED. Answers {"attempts", "duration_ms"}."""

    def __init__(self, settings: Settings, *, db: Database | None = None,
                 budget_seconds: float = 20.0, **deliverer_options: Any) -> None:
        self.settings = settings
        self._db = db
        self.budget_seconds = budget_seconds
        self._options = deliverer_options
        self._deliverer: Deliverer | None = None
        self._lock = threading.Lock()

    def _get(self) -> Deliverer:
        with self._lock:
            if self._deliverer is None:
                from sftq_server.db import get_database

                db = self._db or get_database(self.settings.database_url,
                                              max_size=self.settings.db_pool_max,
                                              timeout=self.settings.db_timeout_seconds)
                self._deliverer = Deliverer(db, self.settings, **self._options)
            return self._deliverer

    def handle(self, method: str, authorization: str | None) -> tuple[int, dict[str, str], bytes]:
        def reply(status: int, body: dict[str, Any],
                  extra: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
            return status, {"Content-Type": "application/json", **(extra or {})}, \
                json.dumps(body).encode()

        if method.upper() != "POST":
            return reply(405, {"error": "use POST", "code": "method_not_allowed"},
                         {"Allow": "POST"})
        secret = self.settings.tick_secret
        if not secret:
            return reply(503, {"error": "SFTQ_TICK_SECRET is not set: refusing to deliver "
                                        "without it", "code": "not_configured"})
        # The same two bearer forms as scheduler-tick: the secret, or pg_cron's two-minute
        # token of it (cron/schedule_webhooks.sql never sends the secret through pg_net).
        from sftq_server.core.tick_secret import bearer_ok

        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not bearer_ok(token.strip(), secret, time.time()):
            return reply(401, {"error": "missing or wrong secret (Authorization: Bearer)",
                               "code": "unauthorized"}, {"WWW-Authenticate": "Bearer"})
        started = time.monotonic()
        try:
            attempts = self._get().run(threading.Event(), budget_seconds=self.budget_seconds,
                                       until_idle=True)
        except SftqError as exc:
            return reply(503, {"error": exc.message, "code": exc.code}, {"Retry-After": "5"})
        return reply(200, {"attempts": attempts,
                           "duration_ms": int((time.monotonic() - started) * 1000)})

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        status, headers, body = self.handle(str(environ.get("REQUEST_METHOD", "GET")),
                                            environ.get("HTTP_AUTHORIZATION"))
        from sftq_server.http.web import status_line

        start_response(status_line(status),
                       [*headers.items(), ("Content-Length", str(len(body)))])
        return [body]


def make_deliver_app(settings: Settings, *, db: Database | None = None,
                     **options: Any) -> DeliverApp:
    return DeliverApp(settings, db=db, **options)
