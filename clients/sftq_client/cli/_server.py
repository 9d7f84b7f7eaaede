"""Server subcommands (db, dev, simulator, tick, ticker, admin, serve): listed in ``sftq --help``
but implemented by ``sftq_server.cli``, which ships only with the server extras."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Final

from ._common import EXIT_OK, EXIT_USAGE, err

# Implemented by sftq_server.cli.main(argv) -> int, which ships only with the server extras.
SERVER_COMMANDS: Final[dict[str, str]] = {
    "db": "[server] migrate and inspect the queue database",
    "dev": "[server] run the whole system locally (database, functions, simulator, ticker)",
    "simulator": "[server] run the Fireworks simulator",
    "tick": "[server] run one scheduler tick",
    "ticker": "[server] run scheduler ticks in a loop (local stand-in for pg_cron)",
    "admin": "[server] manage users and API keys",
    "serve": "[server] serve the three functions at /functions/v1/<name>",
    "deliver": "[server] deliver webhooks in a loop (local stand-in for pg_cron + pg_net)",
    "simulate": "[server] replay a trace of jobs through the real admission on a virtual clock",
}
# Import failures naming these come from a client-only install, not from a bug in the server code.
_SERVER_ONLY_MODULES: Final = frozenset(
    {"sftq_server", "psycopg", "psycopg_pool", "functions_framework", "werkzeug", "gunicorn"}
)


def run_server_command(argv: list[str]) -> int:
    # The one deliberate seam between client and server: the client package never imports server
    # code at module level (a client-only install has no server package), but one `sftq` binary
    # serves both audiences, so server subcommands are resolved by name, only when asked for.
    hint = f"error: `sftq {argv[0]}` needs the server extras: pip install 'finetune-queue[server]'"
    try:
        server_cli = importlib.import_module("sftq_server.cli")
    except ImportError as exc:
        err(hint)
        err(f"({exc})")
        return EXIT_USAGE
    server_main: Callable[[list[str]], int | None] = server_cli.main
    try:
        code = server_main(argv)
    except ModuleNotFoundError as exc:
        # Server code imports its heavy dependencies lazily, so a missing extra can surface here.
        if (exc.name or "").split(".")[0] not in _SERVER_ONLY_MODULES:
            raise
        err(hint)
        err(f"({exc})")
        return EXIT_USAGE
    return EXIT_OK if code is None else int(code)


# ---- argument parsing ---------------------------------------------------------------------------


def server_command_argv(args: list[str]) -> list[str] | None:
    """``[cmd, *rest]`` when args name a server command, after any global connection options.

    Found before argparse runs: argparse would claim the server command's own options (its
    REMAINDER does not capture a leading ``--flag``), and ``sftq db --help`` must reach the server.
    """
    i = 0
    while i < len(args):
        if args[i] in ("--api-key", "--api-url"):
            i += 2
        elif args[i].startswith(("--api-key=", "--api-url=")):
            i += 1
        else:
            break
    if i < len(args) and args[i] in SERVER_COMMANDS:
        return args[i:]
    return None


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name, help_text in SERVER_COMMANDS.items():
        # Listed so `sftq --help` shows them; their own parsing happens in sftq_server.cli.
        s = sub.add_parser(name, help=help_text, add_help=False)
        s.add_argument("rest", nargs=argparse.REMAINDER)
