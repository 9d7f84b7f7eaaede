"""Server-side subcommands of `sftq` (db, dev, simulator, tick, ticker, serve, admin).

Each command group lives in its own module with a `register(subparsers)` function; this
module only assembles them. Those modules import their heavy dependencies inside the
command handlers, so `sftq --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os

# Modules that contribute subcommands; a module that is not there yet is skipped.
COMMAND_MODULES = (
    "sftq_server.cli.db",  # db migrate | status
    "sftq_server.cli.scheduler",  # tick, ticker, simulator
    "sftq_server.cli.dev",  # dev, serve, admin ...
    "sftq_server.cli.webhooks",  # deliver
    "sftq_server.cli.simulate",  # simulate (replay a trace on a virtual clock)
)


def database_url(args: argparse.Namespace) -> str:
    """--database-url, else $DATABASE_URL, else the dev stack's <data-dir>/env."""
    from sftq_server.dev.envfile import read_env_file

    url = getattr(args, "database_url", None) or os.environ.get("DATABASE_URL")
    if not url:
        url = read_env_file(getattr(args, "data_dir", None) or ".sftq").get("DATABASE_URL")
    if not url:
        raise SystemExit(
            "error: no database: pass --database-url, set DATABASE_URL, or start `sftq dev`"
        )
    return url


def register_all(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sftq")
    sub = parser.add_subparsers(dest="cmd", required=True)
    register_all(sub)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result
