"""The scheduler-tick HTTP function: POST with the tick secret runs one tick.

Plain WSGI, so the same object serves under functions-framework (through
functions/scheduler_tick.py), the dev server, or any WSGI host. pg_cron fires it through
pg_net and never reads the answer (the tick records itself in sftq.scheduler_ticks); the
JSON answer is for people and the local ticker.

Answers: 200 with the tick's JSON (also for {"status": "skipped"} when another tick holds
the lease, and for a tick that ended with status "error"); 401 without the right bearer
secret; 405 for anything but POST; 503 when no secret or provider is configured, or when
the database cannot be reached (with Retry-After); 500 for a bug.

Two bearer forms are accepted, both compared in constant time:
- the secret itself (`sftq tick`, the local ticker, a person's curl);
- a short-lived token, `v1.<unix seconds>.<hex HMAC-SHA256 of those seconds keyed by the
  secret>`, valid within TOKEN_WINDOW_SECONDS of this host's clock. pg_cron sends this one
  (cron/schedule_tick.sql builds it from Vault), so the secret itself never waits in pg_net's
  request queue, where it could be read; a token seen there is worth two minutes of ticks,
  which the lease makes harmless anyway.

Outside a dev stack (Settings.dev_stack, SFTQ_DEV_STACK=1) a secret shorter than
MIN_SECRET_CHARS is refused: `require_tick_secret` stops the entry points from starting, and
a TickApp built anyway answers 503 to every request.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from wsgiref.types import StartResponse, WSGIEnvironment

from sftq_server.core.errors import SftqError
from sftq_server.core.settings import Settings
from sftq_server.core.tick_secret import (  # noqa: F401 (the tick's names, as before)
    MIN_SECRET_CHARS,
    TOKEN_WINDOW_SECONDS,
    TickSecretError,
    bearer_ok,
    require_tick_secret,
    tick_secret_problem,
    tick_token,
)

if TYPE_CHECKING:
    from sftq_server.db import Database
    from sftq_server.provider import FireworksClient
    from sftq_server.scheduler.wake import Pass

logger = logging.getLogger(__name__)

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}

Answer = tuple[int, dict[str, str], bytes]
# The body says which pass to run; it is a few bytes, and nothing else is read.
MAX_BODY_BYTES = 4096


def _pass(body: bytes) -> Pass | None:
    """The pass a POST asks for: {} (or no body) a tick, {"wake": true} a woken tick,
    {"pass": "reconcile"} a reconcile pass; None for anything else."""
    if not body.strip():
        return "tick"
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if data.get("wake") is True and set(data) == {"wake"}:
        return "wake"
    if set(data) == {"pass"} and data["pass"] in ("tick", "wake", "reconcile"):
        return data["pass"]  # type: ignore[no-any-return]
    return "tick" if not data else None

def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
    return status, {"Content-Type": "application/json", **(headers or {})}, \
        json.dumps(body, default=str).encode()


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Answer:
    return _json(status, {"error": message, "code": code}, headers)


class TickApp:
    """The tick endpoint as a WSGI callable; `handle` is the framework-free core."""

    def __init__(self, settings: Settings, *, db: Database | None = None,
                 provider_factory: Callable[[], FireworksClient] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self._refusal = tick_secret_problem(settings)
        if self._refusal:
            logger.error("scheduler-tick refuses to run: %s", self._refusal)
        self._db = db
        self._provider_factory = provider_factory
        self._provider: FireworksClient | None = None
        self._lock = threading.Lock()

    # -- lazily built dependencies (cold start: nothing is opened before the first tick) --

    def _database(self) -> Database:
        if self._db is None:
            from sftq_server.db import get_database

            self._db = get_database(self.settings.database_url, max_size=self.settings.db_pool_max,
                                    timeout=self.settings.db_timeout_seconds)
        return self._db

    def _get_provider(self) -> FireworksClient:
        with self._lock:
            if self._provider is None:
                if self._provider_factory is not None:
                    self._provider = self._provider_factory()
                else:
                    from sftq_server.budget import DbBudget
                    from sftq_server.provider import FireworksClient

                    s = self.settings
                    self._provider = FireworksClient(
                        base_url=s.fireworks_base_url, api_key=s.fireworks_api_key,
                        account_id=s.fireworks_account_id, quota_id=s.fireworks_quota_id,
                        timeout=s.fireworks_timeout_seconds, rpm=s.fireworks_rpm,
                        budget=DbBudget(self._database(), s, "tick"))
            return self._provider

    def close(self) -> None:
        """Close what this app opened (the provider client; a shared pool stays open)."""
        with self._lock:
            if self._provider is not None:
                self._provider.close()
                self._provider = None

    # -- the endpoint -----------------------------------------------------------------

    def handle(self, method: str, authorization: str | None, body: bytes = b"") -> Answer:
        if method.upper() != "POST":
            return _error(405, "method_not_allowed", "use POST", {"Allow": "POST"})
        secret = self.settings.tick_secret
        if not secret:
            # An open tick endpoint lets anyone on the internet drive the scheduler.
            return _error(503, "not_configured",
                          "SFTQ_TICK_SECRET is not set: refusing to run ticks without it")
        if self._refusal:
            return _error(503, "not_configured", self._refusal)
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not bearer_ok(token.strip(), secret, self._clock()):
            return _error(401, "unauthorized",
                          "missing or wrong tick secret (Authorization: Bearer)",
                          {"WWW-Authenticate": "Bearer"})
        if not self.settings.database_url and self._db is None:
            return _error(503, "not_configured", "DATABASE_URL is not set")
        try:
            provider = self._get_provider()
        except ValueError as exc:
            # Missing FIREWORKS_API_KEY or account: a deployment mistake, not a tick failure.
            return _error(503, "not_configured", f"provider not configured: {exc}")

        pass_ = _pass(body)
        if pass_ is None:
            return _error(400, "bad_request",
                          'the body is {} (a tick), {"wake": true} or {"pass": "reconcile"}')

        from sftq_server.scheduler.tick import run_tick

        try:
            if pass_ != "tick":
                skip = self._early_pass_refusal(pass_)
                if skip is not None:
                    return _json(200, {"status": "skipped", "pass": pass_, "reason": skip})
            result = run_tick(self._database(), provider, self.settings, pass_=pass_)
        except SftqError as exc:
            # Raised only before the lease is taken: the database is not reachable.
            headers = dict(exc.headers)
            if exc.status == 503:
                headers.setdefault("Retry-After", "5")
            return _error(exc.status if exc.status >= 500 else 503, exc.code, exc.message,
                          headers)
        except Exception:
            logger.exception("scheduler tick failed")
            return _error(500, "internal", "the tick failed unexpectedly; see the function log")
        return _json(200, result)

    def _early_pass_refusal(self, pass_: Pass) -> str | None:
        """Why a woken tick or a reconcile pass is not run now (None: run it). A woken tick
        first waits out the rest of the gap since the last tick (WakePlan)."""
        from sftq_server.scheduler.wake import WakePlan, WakeState

        plan = WakePlan.from_settings(self.settings)
        state = WakeState.read(self._database())
        if not plan.budget_room(state):
            return (f"the tick has made {state.tick_calls} provider calls in the last minute, "
                    f"of its reserve of {plan.reserve_calls} (SFTQ_PROVIDER_TICK_RESERVE of "
                    "FIREWORKS_RPM): the rest is kept for the periodic tick, which admits")
        if pass_ == "wake":
            if not plan.event_admission:
                return ("event admission is off (SFTQ_EVENT_ADMISSION=off): admission runs at "
                        "the periodic tick")
            if state.wake_age is None:
                return "no wake pending: a tick has taken it already"
            wait = plan.wait_before_woken_tick(state)
            if wait is None:
                return (f"woken ticks are {plan.gap:g} s apart at this FIREWORKS_RPM: the "
                        "periodic tick admits")
            if wait > 0:
                time.sleep(wait)
            return None
        if plan.reconcile_every == float("inf"):
            return "reconcile passes are off (SFTQ_RECONCILE_FRESHNESS_SECONDS=0)"
        if state.last_tick_age is not None and state.last_tick_age < plan.reconcile_every:
            return (f"the last tick is {state.last_tick_age:.1f} s old: passes come every "
                    f"{plan.reconcile_every:g} s at most (freshness within the request budget)")
        return None

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        try:
            length = min(int(environ.get("CONTENT_LENGTH") or 0), MAX_BODY_BYTES)
        except ValueError:
            length = 0
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        status, headers, body = self.handle(str(environ.get("REQUEST_METHOD", "GET")),
                                            environ.get("HTTP_AUTHORIZATION"), body)
        start_response(f"{status} {_REASONS.get(status, 'Error')}",
                       [*headers.items(), ("Content-Length", str(len(body)))])
        return [body]


def make_tick_app(settings: Settings, *, db: Database | None = None,
                  provider_factory: Callable[[], FireworksClient] | None = None,
                  clock: Callable[[], float] = time.time) -> TickApp:
    """The scheduler-tick WSGI app. `db` and `provider_factory` (a no-argument callable,
    called once, on the first tick) replace the ones built from `settings`; `clock` is what
    tokens are checked against."""
    return TickApp(settings, db=db, provider_factory=provider_factory, clock=clock)
