"""`sftq dev`, `sftq serve` and `sftq admin ...`.

Also runnable as `python -m sftq_server.cli.dev <any server command>`: that is how the dev
stack starts its children with the same interpreter, whatever is (or is not) on PATH.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sftq_server.dev.admin import UserStatus

DATA_DIR_HELP = "dev stack folder (default: .sftq)"


def _non_negative(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return number


def _port(value: str) -> int:
    number = int(value)
    if not 0 < number < 65536:
        raise argparse.ArgumentTypeError("must be a port number between 1 and 65535")
    return number


# -- sftq dev ----------------------------------------------------------------------------
def _cmd_dev(args: argparse.Namespace) -> int:
    from sftq_server.dev.stack import DevConfig, DevStack

    config = DevConfig(
        data_dir=Path(args.data_dir),
        host=args.host,
        port=args.port,
        simulator_port=args.simulator_port,
        simulator_job_seconds=args.simulator_job_seconds,
        tick_interval=args.tick_interval,
        provider=args.provider,
        verbose=args.verbose,
    )
    return DevStack(config).run()


# -- sftq serve --------------------------------------------------------------------------
def _cmd_serve(args: argparse.Namespace) -> int:
    import dataclasses
    import logging

    from sftq_server.cli import database_url
    from sftq_server.core import logs as logs
    from sftq_server.core.settings import Settings
    from sftq_server.http import gateway as gateway

    settings = dataclasses.replace(Settings.from_env(), database_url=database_url(args))
    logs.configure()
    if not args.verbose:
        # One line per request (the access log) and one per tick; not one more per call the
        # tick makes to the provider.
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
    gateway.serve(args.host, args.port, settings)
    return 0


# -- sftq admin --------------------------------------------------------------------------
def _cmd_admin(args: argparse.Namespace) -> int:
    from sftq_server.cli import database_url
    from sftq_server.dev import admin as admin

    try:
        url = database_url(args)
    except SystemExit as exc:  # no database configured: a usage error, like a missing flag
        print(exc.code, file=sys.stderr)
        return 2
    try:
        if args.admin_cmd == "create-user":
            admin.create_user(url, args.name, args.cap)
            cap = 1 if args.cap is None else args.cap
            print(f"created user {args.name} (cap {cap})")
            print(f"give them a key with: sftq admin issue-key {args.name}", file=sys.stderr)
        elif args.admin_cmd == "issue-key":
            key, prefix = admin.issue_key(url, args.name)
            # The key alone on stdout, so `KEY=$(sftq admin issue-key NAME)` just works.
            print(key, flush=True)
            print(
                f"note: this is the only time key {prefix}... for {args.name} is shown; only its "
                f"hash is stored. Revoke it with: sftq admin revoke-key {prefix}",
                file=sys.stderr,
            )
        elif args.admin_cmd == "revoke-key":
            admin.revoke_key(url, args.key_prefix)
            print(f"revoked the key starting with {args.key_prefix}")
        elif args.admin_cmd == "list-users":
            users = admin.list_users(url)
            if args.json:
                print(json.dumps([u.as_json() for u in users], indent=2))
            else:
                print(admin.format_table(users))
        elif args.admin_cmd == "set-cap":
            admin.set_cap(url, args.name, args.cap)
            print(f"{args.name} may now run {args.cap} job(s) at once")
        elif args.admin_cmd == "set-limits":
            if (args.name is None) == (not args.default):
                print("error: give a user NAME or --default (not both)", file=sys.stderr)
                return 2
            changes = {k: admin.parse_limit(v) for k, v in (
                ("rate_per_minute", args.rpm), ("max_queued", args.max_queued),
                ("max_streams", args.max_streams)) if v is not None}
            limits = admin.set_limits(url, args.name, changes)
            who = "the default" if args.name is None else args.name
            print(f"{who}: {limits.describe()}")
        elif args.admin_cmd in ("disable-user", "enable-user"):
            disabled = args.admin_cmd == "disable-user"
            status = admin.set_disabled(url, args.name, disabled)
            print(_disabled_line(args.name, disabled, status))
    except admin.AdminError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    return 0


def _disabled_line(name: str, disabled: bool, status: UserStatus) -> str:
    jobs = f"{status.queued} queued, {status.running} running"
    if disabled:
        head = f"disabled {name}" if status.changed else f"{name} was already disabled"
        return (
            f"{head}: their keys answer 401; {jobs} (queued jobs wait without being admitted, "
            "running ones run to the end); undo with: sftq admin enable-user " + name
        )
    head = f"enabled {name}" if status.changed else f"{name} was not disabled"
    return f"{head}: their keys work again; {jobs} (queued jobs are admitted in FIFO order again)"


def _database_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--database-url",
        help="PostgreSQL URL (default: $DATABASE_URL, else DATABASE_URL in <data-dir>/env)",
    )
    p.add_argument("--data-dir", default=".sftq", help=DATA_DIR_HELP)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    dev = sub.add_parser(
        "dev",
        help="run the whole system locally (database, functions, simulator, ticker)",
        description="Run the database (DATABASE_URL, else an embedded PostgreSQL in --data-dir), "
        "the functions behind one port, the Fireworks simulator and a ticker. Prints "
        "KEY=value lines (also written to <data-dir>/env), then `ready`.",
    )
    dev.add_argument("--data-dir", default=".sftq", help=DATA_DIR_HELP)
    dev.add_argument(
        "--host", default="127.0.0.1", help="address of the functions (default: 127.0.0.1)"
    )
    dev.add_argument(
        "--port", type=_port, default=8080, help="port of the functions (default: 8080)"
    )
    dev.add_argument(
        "--provider",
        choices=("simulator", "fireworks"),
        default="simulator",
        help="where jobs run: the simulator (default) or real Fireworks "
        "(needs FIREWORKS_API_KEY and FIREWORKS_ACCOUNT_ID)",
    )
    dev.add_argument(
        "--simulator-port",
        type=_port,
        default=8090,
        help="port of the simulator, on 127.0.0.1 (default: 8090)",
    )
    dev.add_argument(
        "--simulator-job-seconds",
        type=_non_negative,
        default=60.0,
        help="how long a simulated job runs; 0: until finished through "
        "POST /_sim/jobs/{collection}/{id}:finish (default: 60)",
    )
    dev.add_argument(
        "--tick-interval",
        type=_non_negative,
        default=30.0,
        help="seconds between scheduler ticks; 0: no ticker, tick with "
        "POST /functions/v1/scheduler-tick (default: 30)",
    )
    dev.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log details: each request to the provider, and the ticker's own line per tick "
        "(default: one line per tick, from the functions)",
    )
    dev.set_defaults(func=_cmd_dev)

    serve = sub.add_parser("serve", help="serve the three functions at /functions/v1/<name>")
    serve.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8080, help="port (default: 8080)")
    serve.add_argument(
        "-v", "--verbose", action="store_true", help="also log each request to the provider"
    )
    _database_options(serve)
    serve.set_defaults(func=_cmd_serve)

    adm = sub.add_parser("admin", help="manage users and API keys")
    adm_sub = adm.add_subparsers(dest="admin_cmd", required=True, metavar="COMMAND")
    p = adm_sub.add_parser("create-user", help="create a user")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--cap", type=int, help="jobs the user may run at once (default: 1)")
    _database_options(p)
    p = adm_sub.add_parser("issue-key", help="issue an API key; prints it alone, this once")
    p.add_argument("name", metavar="NAME")
    _database_options(p)
    p = adm_sub.add_parser("revoke-key", help="revoke the active key starting with KEY_PREFIX")
    p.add_argument("key_prefix", metavar="KEY_PREFIX")
    _database_options(p)
    p = adm_sub.add_parser("list-users",
                           help="users with caps, job counts, keys and limits")
    p.add_argument("--json", action="store_true", help="print JSON")
    _database_options(p)
    from sftq_server.dev.admin import LIMITS_HELP

    p = adm_sub.add_parser(
        "set-limits",
        help="set a user's (or the default) request rate, queued jobs and open streams",
        description="Set the per-user limits of user NAME, or with --default those of every "
        "user without their own. " + LIMITS_HELP,
    )
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("--default", action="store_true",
                   help="set the defaults (every user without a limit of their own)")
    p.add_argument("--rpm", metavar="N", help="requests a minute (0: none; default)")
    p.add_argument("--max-queued", metavar="N", help="QUEUED jobs at once (0: none; default)")
    p.add_argument("--max-streams", metavar="N",
                   help="open streams and MCP waits at once (0: none; default)")
    _database_options(p)
    p = adm_sub.add_parser("set-cap", help="set how many jobs a user may run at once")
    p.add_argument("name", metavar="NAME")
    p.add_argument("cap", metavar="N", type=int)
    _database_options(p)
    from sftq_server.dev.admin import DISABLE_HELP

    p = adm_sub.add_parser(
        "disable-user",
        help="stop a user's keys working; their queued jobs wait, running ones finish",
        description="Disable user NAME. " + DISABLE_HELP,
    )
    p.add_argument("name", metavar="NAME")
    _database_options(p)
    p = adm_sub.add_parser(
        "enable-user",
        help="undo disable-user: keys work again, queued jobs are admitted again",
        description="Enable user NAME again: their keys work again (unless revoked) and their "
        "queued jobs are admitted again, in FIFO order by submission time.",
    )
    p.add_argument("name", metavar="NAME")
    _database_options(p)
    adm.set_defaults(func=_cmd_admin)


if __name__ == "__main__":
    from sftq_server.cli import main

    raise SystemExit(main(sys.argv[1:]))
