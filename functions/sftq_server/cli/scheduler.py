"""`sftq tick`, `sftq ticker` and `sftq simulator`.

- `sftq tick` runs one scheduler tick from a shell and prints its JSON.
- `sftq ticker` is the local stand-in for pg_cron: it POSTs to the scheduler-tick function
  every N seconds (or, with --direct, runs the tick in-process against the database).
- `sftq simulator` serves the in-process Fireworks simulator on loopback.

Heavy imports happen inside the handlers so `sftq --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from sftq_server.core.settings import Settings
    from sftq_server.db import Database
    from sftq_server.provider import FireworksClient
    from sftq_server.scheduler.wake import Pass, WakePlan

# Exit codes of `sftq tick`.
EXIT_OK = 0  # the tick ran (status ok) or another tick held the lease (skipped)
EXIT_TICK_ERROR = 1  # the tick ran and recorded errors (status error)
EXIT_USAGE = 2  # missing or bad configuration
EXIT_UNAVAILABLE = 3  # the database could not be reached

# A simulator accepts any key; the account must match its --account-id (default sim-account).
SIM_API_KEY = "sim-local-key"
SIM_ACCOUNT = "sim-account"


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _config(args: argparse.Namespace) -> dict[str, str]:
    """The dev stack's env file under the process environment (the environment wins)."""
    from sftq_server.dev.envfile import read_env_file

    return read_env_file(getattr(args, "data_dir", None) or ".sftq") | dict(os.environ)


def _settings(args: argparse.Namespace) -> Settings:
    from sftq_server.cli import database_url
    from sftq_server.core.settings import Settings

    return dataclasses.replace(Settings.from_env(), database_url=database_url(args))


def _provider(args: argparse.Namespace, settings: Settings, config: Mapping[str, str]
              ) -> FireworksClient:
    from sftq_server.provider import FireworksClient

    # An explicit --simulator-url wins; then real Fireworks credentials; then the simulator
    # of a running `sftq dev` (its env file names it), so a bare `sftq tick` works there.
    sim_url = args.simulator_url or (
        None if config.get("FIREWORKS_API_KEY") else config.get("SIMULATOR_URL"))
    if sim_url:
        return FireworksClient(
            base_url=sim_url,
            api_key=config.get("FIREWORKS_API_KEY") or SIM_API_KEY,
            account_id=config.get("FIREWORKS_ACCOUNT_ID") or SIM_ACCOUNT,
            quota_id=config.get("FIREWORKS_QUOTA_ID") or settings.fireworks_quota_id,
            timeout=settings.fireworks_timeout_seconds,
            rpm=settings.fireworks_rpm,
        )
    return FireworksClient.from_env({k: v for k, v in config.items() if k.startswith("FIREWORKS_")})


def _open(args: argparse.Namespace) -> tuple[Database, FireworksClient, Settings]:
    """Settings, provider and database for in-process ticks (ValueError: provider config).
    The provider's calls draw on the deployment's one budget, as scheduler-tick's do."""
    from sftq_server.budget import DbBudget
    from sftq_server.db import Database

    settings = _settings(args)
    provider = _provider(args, settings, _config(args))
    db = Database(settings.database_url, max_size=2, timeout=settings.db_timeout_seconds)
    provider.budget = DbBudget(db, settings, "tick")
    return db, provider, settings


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# -- sftq tick -------------------------------------------------------------------------


def _cmd_tick(args: argparse.Namespace) -> int:
    from sftq_server.core.errors import SftqError
    from sftq_server.scheduler.tick import run_tick

    _setup_logging(args.verbose)
    try:
        db, provider, settings = _open(args)
    except ValueError as exc:
        _err(f"error: {exc} (or pass --simulator-url URL)")
        return EXIT_USAGE
    try:
        result = run_tick(db, provider, settings, holder=args.holder)
    except SftqError as exc:
        _err(f"error: {exc.message}")
        return EXIT_UNAVAILABLE
    finally:
        provider.close()
        db.close()
    print(json.dumps(result, indent=2, default=str), flush=True)
    return EXIT_TICK_ERROR if result.get("status") == "error" else EXIT_OK


# -- sftq ticker -----------------------------------------------------------------------


def summarize(result: Mapping[str, Any]) -> str:
    """One log line for a tick's JSON."""
    status = result.get("status")
    if status == "skipped":
        return "skipped: another tick holds the lease"
    admitted = result.get("admitted")
    n_admitted = len(admitted) if isinstance(admitted, list) else admitted
    errors = result.get("errors") or []
    line = (f"tick {result.get('tick_id')} {status}: admitted {n_admitted}, "
            f"submitted {result.get('submitted')}, reconciled {result.get('reconciled')}, "
            f"cancelled {result.get('cancelled')}, failed {result.get('failed')}, "
            f"budget {result.get('budget')}, {result.get('duration_ms')} ms")
    if errors:
        line += f", {len(errors)} error(s): {errors[0]}"
    return line


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM; the handlers are restored afterwards."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _loop(interval: float, max_ticks: int, fire: Callable[[Pass], str],
          waker: Waker | None = None) -> int:
    """Fire a tick every `interval` seconds (start to start) until a signal or `max_ticks`;
    between them, with a waker, a woken tick or a reconcile pass whenever it says one is due."""
    from sftq_server.scheduler.wake import POLL_SECONDS

    with stop_on_signals() as stop:
        fired = 0
        next_tick = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            kind: Pass | None = None
            if now >= next_tick:
                kind = "tick"
                next_tick = now + interval
            elif waker is not None:
                kind = waker.due()
            if kind is None:
                wait = max(0.0, next_tick - now)
                stop.wait(wait if waker is None else min(wait, POLL_SECONDS))
                continue
            try:
                line = fire(kind)
            except Exception as exc:  # noqa: BLE001 - the ticker outlives any one tick
                line = f"error: {type(exc).__name__}: {exc}"
            if line:  # "": a tick the function has logged itself (--quiet)
                label = "" if kind == "tick" else f"{kind}: "
                print(f"{_now()} {label}{line}", flush=True)
            fired += 1
            if max_ticks and fired >= max_ticks:
                break
            # No wait: a wake that landed during that tick is due at once (the gap permitting).
    return EXIT_OK


class Waker:
    """Polls the wake flag (sftq.admission_wake_state) and says which early pass is due.

    A poll, not LISTEN: it works through any pooler (LISTEN needs a session of its own,
    which a transaction-mode pooler does not give), it costs one small indexed read every
    POLL_SECONDS, and the events need no NOTIFY, which would serialise the commits of every
    submit on the notification queue's lock.
    """

    def __init__(self, db: Database, plan: WakePlan) -> None:
        self.db = db
        self.plan = plan
        self._failing = False

    def due(self) -> Pass | None:
        from sftq_server.core.errors import SftqError
        from sftq_server.scheduler.wake import WakeState

        try:
            state = WakeState.read(self.db)
        except SftqError as exc:
            if not self._failing:  # once per outage: the periodic tick goes on regardless
                print(f"{_now()} wake: cannot read the wake flag ({exc.message}); "
                      "ticking on the interval only until it answers", flush=True)
            self._failing = True
            return None
        if self._failing:
            print(f"{_now()} wake: reading the wake flag again", flush=True)
            self._failing = False
        return self.plan.due(state)

    def describe(self) -> str:
        parts = []
        if self.plan.event_admission:
            parts.append(f"woken admission (ticks at least {self.plan.gap:g}s apart)")
        if self.plan.reconcile_every != float("inf"):
            parts.append(f"reconcile passes every {self.plan.reconcile_every:g}s while jobs run")
        return ", ".join(parts) or "no early ticks"


def _waker(db_url: str | None, settings: Settings) -> tuple[Waker | None, Database | None]:
    """A waker on `db_url`, unless the settings want no early pass or there is no URL."""
    from sftq_server.db import Database
    from sftq_server.scheduler.wake import WakePlan

    plan = WakePlan.from_settings(settings)
    if not db_url or (not plan.event_admission and plan.reconcile_every == float("inf")):
        return None, None
    db = Database(db_url, max_size=1, timeout=settings.db_timeout_seconds)
    return Waker(db, plan), db


def _http_fire(client: httpx.Client, url: str, secret: str, quiet: bool = False
               ) -> Callable[[Pass], str]:
    """POST one tick (a woken tick or a reconcile pass: its body says which); its line. With
    quiet, "" for a tick that ran: the function logs it."""
    import httpx

    bodies: dict[str, dict[str, Any]] = {"tick": {}, "wake": {"wake": True},
                                         "reconcile": {"pass": "reconcile"}}

    def fire(kind: Pass = "tick") -> str:
        try:
            response = client.post(url, headers={"Authorization": f"Bearer {secret}"},
                                   json=bodies[kind])
        except httpx.HTTPError as exc:
            return f"error: {type(exc).__name__}: could not reach {url}"
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code == 200 and isinstance(body, dict):
            return "" if quiet else summarize(body)
        detail = body.get("error") if isinstance(body, dict) else response.text[:200]
        return f"HTTP {response.status_code}: {detail}"

    return fire


def _cmd_ticker(args: argparse.Namespace) -> int:
    _setup_logging(args.verbose)
    if args.interval <= 0:
        _err("error: --interval must be positive")
        return EXIT_USAGE
    if args.direct:
        return _ticker_direct(args)
    import httpx

    from sftq_server.core.settings import Settings

    config = _config(args)
    url = args.url
    if not url:
        base = config.get("SUPABASE_URL", "").rstrip("/")
        if not base:
            _err("error: pass --url, or set SUPABASE_URL (the tick is POSTed to "
                 "$SUPABASE_URL/functions/v1/scheduler-tick), or use --direct")
            return EXIT_USAGE
        url = f"{base}/functions/v1/scheduler-tick"
    secret = config.get("SFTQ_TICK_SECRET", "")
    if not secret:
        _err("error: SFTQ_TICK_SECRET is not set")
        return EXIT_USAGE
    settings = Settings.from_env()
    waker, wake_db = _waker(args.database_url or config.get("DATABASE_URL"), settings)
    print(f"{_now()} ticker: POST {url} every {args.interval:g}s"
          + (f"; {waker.describe()}" if waker else ""), flush=True)
    try:
        with httpx.Client(timeout=args.timeout) as client:
            return _loop(args.interval, args.max_ticks,
                         _http_fire(client, url, secret, quiet=args.quiet), waker)
    finally:
        if wake_db is not None:
            wake_db.close()


def _ticker_direct(args: argparse.Namespace) -> int:
    from sftq_server.core.errors import SftqError
    from sftq_server.scheduler.tick import run_tick

    try:
        db, provider, settings = _open(args)
    except ValueError as exc:
        _err(f"error: {exc} (or pass --simulator-url URL)")
        return EXIT_USAGE
    waker, wake_db = _waker(settings.database_url, settings)

    def fire(kind: Pass = "tick") -> str:
        try:
            return summarize(run_tick(db, provider, settings, pass_=kind))
        except SftqError as exc:
            return f"error: {exc.message}"

    print(f"{_now()} ticker: direct ticks every {args.interval:g}s"
          + (f"; {waker.describe()}" if waker else ""), flush=True)
    try:
        return _loop(args.interval, args.max_ticks, fire, waker)
    finally:
        provider.close()
        db.close()
        if wake_db is not None:
            wake_db.close()


# -- sftq simulator --------------------------------------------------------------------


def _cmd_simulator(args: argparse.Namespace) -> int:
    from sftq_server.simulator import StateFileError, serve

    _setup_logging(args.verbose)
    try:
        serve(args.host, args.port, args.job_seconds, account_id=args.account_id,
              max_value=args.max_gpus, state_file=args.state_file)
    except StateFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


# -- registration ----------------------------------------------------------------------


def _add_db_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", help="PostgreSQL URL (default: $DATABASE_URL, else .sftq/env)")
    p.add_argument("--data-dir", default=".sftq", help="dev stack folder whose env file to read")
    p.add_argument("--simulator-url", metavar="URL",
                   help="talk to the Fireworks simulator at URL instead of Fireworks (default: "
                   "FIREWORKS_* settings, else SIMULATOR_URL from the environment or env file)")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("tick", help="run one scheduler tick and print its JSON",
                       description="Run one scheduler tick against the database and print "
                       "its JSON. Exit 0 ok/skipped, 1 tick recorded errors, 2 configuration, "
                       "3 database unreachable.")
    _add_db_options(p)
    p.add_argument("--holder", help="lease holder name (default host:pid)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    p.set_defaults(func=_cmd_tick)

    t = sub.add_parser("ticker", help="fire scheduler ticks every N seconds (local pg_cron)",
                       description="POST to the scheduler-tick function every --interval "
                       "seconds with $SFTQ_TICK_SECRET, or run ticks in-process with --direct. "
                       "Logs one line per tick (-q: only ticks that could not run; -v: details "
                       "too); stops on SIGINT/SIGTERM.")
    t.add_argument("--interval", type=float, default=30.0, help="seconds between ticks (30)")
    t.add_argument("--url",
                   help="scheduler-tick URL (default $SUPABASE_URL/functions/v1/scheduler-tick)")
    t.add_argument("--timeout", type=float, default=60.0, help="HTTP timeout per tick (60 s)")
    t.add_argument("--direct", action="store_true",
                   help="run ticks in this process against the database instead of over HTTP")
    t.add_argument("--max-ticks", type=int, default=0, help="stop after this many ticks (0: never)")
    t.add_argument("-q", "--quiet", action="store_true",
                   help="print only ticks that could not run (unreachable, HTTP error): the "
                   "scheduler-tick function logs every tick itself (`sftq dev` uses this)")
    _add_db_options(t)
    t.add_argument("-v", "--verbose", action="store_true",
                   help="log at INFO (each HTTP request, the tick's details)")
    t.set_defaults(func=_cmd_ticker)

    s = sub.add_parser("simulator", help="serve the Fireworks simulator",
                       description="Serve the in-process Fireworks simulator (with its /_sim "
                       "control surface) until SIGINT/SIGTERM.")
    s.add_argument("--port", type=int, default=8089)
    s.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    s.add_argument("--job-seconds", type=float, default=60.0,
                   help="how long a simulated job runs (0: until finished through /_sim)")
    s.add_argument("--max-gpus", type=int, default=64, help="the training GPU quota's maxValue")
    s.add_argument("--account-id", default=SIM_ACCOUNT)
    s.add_argument("--state-file", metavar="PATH",
                   help="keep the account (jobs and their clocks, quota, resources, faults) in "
                   "this file and pick it up on the next start (default: in memory only)")
    s.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    s.set_defaults(func=_cmd_simulator)
