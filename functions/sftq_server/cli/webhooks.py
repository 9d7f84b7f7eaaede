"""`sftq deliver`: deliver webhooks in a loop (the local stand-in for pg_cron + pg_net).

`sftq dev` runs one, whatever --tick-interval says. Any number may run against one database
(claims are leases with FOR UPDATE SKIP LOCKED); each prints one line per attempt and stops
on SIGINT/SIGTERM after the attempts in flight (at most the 10 s timeout).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return number


def _count(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def _cmd_worker(args: argparse.Namespace) -> int:
    from sftq_server.cli import database_url
    from sftq_server.cli.scheduler import stop_on_signals
    from sftq_server.core.settings import Settings
    from sftq_server.db import Database
    from sftq_server.webhooks import TIMEOUT_SECONDS, Deliverer, Outcome

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = dataclasses.replace(Settings.from_env(), database_url=database_url(args))
    if args.lease_seconds <= TIMEOUT_SECONDS + 1:
        print(f"error: --lease-seconds must be more than {TIMEOUT_SECONDS + 1:g}",
              file=sys.stderr)
        return 2

    def show(outcome: Outcome) -> None:
        print(outcome.line(), flush=True)

    db = Database(settings.database_url, max_size=2, timeout=settings.db_timeout_seconds)
    try:
        deliverer = Deliverer(db, settings, concurrency=args.concurrency,
                              per_endpoint=args.per_endpoint, lease_seconds=args.lease_seconds,
                              on_outcome=show)
    except ValueError as exc:  # a malformed SFTQ_WEBHOOKS_KEY
        print(f"error: {exc}", file=sys.stderr)
        db.close()
        return 2
    mode = "private destinations allowed" if settings.webhooks_allow_private else \
        "public https destinations only"
    print(f"sftq deliver: delivering webhooks, {args.concurrency} at once, "
          f"{args.per_endpoint} per endpoint, polling every {args.poll_interval:g}s ({mode})",
          flush=True)
    try:
        with stop_on_signals() as stop:
            deliverer.run(stop, poll_interval=args.poll_interval)
    finally:
        db.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "deliver", help="deliver webhooks in a loop (local stand-in for pg_cron + pg_net)",
        description="Claim due webhook deliveries, sign and send them, record each attempt; "
        "poll for new ones every --poll-interval seconds. Reads SFTQ_WEBHOOKS_KEY and "
        "SFTQ_WEBHOOKS_ALLOW_PRIVATE. Stops on SIGINT/SIGTERM.")
    p.add_argument("--database-url",
                   help="PostgreSQL URL (default: $DATABASE_URL, else DATABASE_URL in "
                   "<data-dir>/env)")
    p.add_argument("--data-dir", default=".sftq", help="dev stack folder (default: .sftq)")
    p.add_argument("--concurrency", type=_count, default=16,
                   help="deliveries in flight at once (default 16)")
    p.add_argument("--per-endpoint", type=_count, default=4,
                   help="deliveries in flight at once per endpoint, across all workers "
                   "(default 4)")
    p.add_argument("--poll-interval", type=_positive, default=0.25,
                   help="seconds between looks for new deliveries when idle (default 0.25)")
    p.add_argument("--lease-seconds", type=_positive, default=60.0,
                   help="how long a claimed delivery stays ours; a worker that dies leaves "
                   "its deliveries due again after this (default 60)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    p.set_defaults(func=_cmd_worker)
