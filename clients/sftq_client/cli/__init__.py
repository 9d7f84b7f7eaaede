"""The ``sftq`` command line.

User commands talk to the jobs-api through :class:`sftq_client.Client`, one module per command
group (``jobs``, ``analytics``, ``webhooks``); each module has a ``register(command)`` that adds its
subcommands. Server commands (db, dev, simulator, tick, ticker, admin, serve) belong to the server
package and are only dispatched from here (``_server``).

Human-readable tables go to stdout by default, ``--json`` prints machine JSON on stdout instead, and
every diagnostic goes to stderr, so ``sftq ... --json | jq`` always sees clean JSON. Exit codes are
listed in docs/cli.md and in the EXIT_* constants of ``_common``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from .._client import Client
from .._version import __version__
from ..errors import (
    AmbiguousJobId,
    APIConnectionError,
    BadRequest,
    ConfigurationError,
    Conflict,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    SftqError,
    Unauthorized,
    WaitTimeout,
)
from . import analytics, dashboard, jobs, mcp, skill, visibility, watch, webhooks
from ._common import (
    EXIT_CODES,
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_UNAUTHORIZED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    EXIT_WAIT_TIMEOUT,
    ClientFactory,
    Context,
    Handler,
    UsageError,
    add_connection_options,
    err,
    table,
)
from ._server import SERVER_COMMANDS, run_server_command, server_command_argv
from ._server import register as register_server_commands

__all__ = ["EXIT_CODES", "SERVER_COMMANDS", "client_factory", "main"]

# The command groups, in the order `sftq --help` lists them.
_GROUPS = (jobs, analytics, watch, visibility, webhooks, dashboard, mcp, skill)


def _default_client_factory(api_key: str | None, api_url: str | None) -> Client:
    return Client(api_key=api_key, base_url=api_url)


# Every command builds its client through this name, so tests can swap in one with a mock transport.
client_factory: ClientFactory = _default_client_factory


def _stderr_is_tty() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sftq",
        description="Submit, list, watch and cancel Fireworks fine-tuning jobs through "
        "the finetune-queue scheduler.",
        epilog="exit codes:\n"
        + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sftq {__version__}")
    add_connection_options(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", metavar="<command>", title="commands")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_connection_options(p, top_level=False)
        return p

    for group in _GROUPS:
        group.register(command)
    register_server_commands(sub)
    return parser


# ---- errors and entry point ---------------------------------------------------------------------


def _exit_code_for(exc: SftqError) -> int:
    if isinstance(exc, (ConfigurationError, AmbiguousJobId)):
        return EXIT_USAGE
    if isinstance(exc, Unauthorized):
        return EXIT_UNAUTHORIZED
    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, Conflict):
        return EXIT_CONFLICT
    if isinstance(exc, (APIConnectionError, ServerError, RateLimited)):
        return EXIT_UNAVAILABLE
    if isinstance(exc, (BadRequest, PayloadTooLarge)):
        return EXIT_REJECTED
    if isinstance(exc, WaitTimeout):
        return EXIT_WAIT_TIMEOUT
    return EXIT_ERROR


def _report(exc: SftqError) -> None:
    if isinstance(exc, ConfigurationError) and exc.missing:
        # The CLI's words (options and variables), every missing setting at once.
        err("error: missing settings:")
        for setting in exc.missing:
            err(f"  {setting.what}: {setting.ways('cli')}")
        return
    err(f"error: {exc}")
    if isinstance(exc, AmbiguousJobId):
        err(
            table(
                ("ID", "KIND", "STATE", "CREATED", "NAME"),
                [[j.id, j.kind, j.state, j.created_at, j.display_name] for j in exc.candidates],
            )
        )
        return
    if exc.details is not None:
        err(f"details: {json.dumps(exc.details, default=str)}")
    if isinstance(exc, Unauthorized):
        err("hint: check SFTQ_API_KEY (or --api-key); keys start with sftq_")
    elif isinstance(exc, (RateLimited, ServerError)) and exc.retry_after is not None:
        err(f"hint: the server asked to retry after {exc.retry_after:g}s")


def _exit_status(code: object) -> int:
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sftq`` with ``argv`` (default: sys.argv[1:]) and return the exit code.

    The console script does ``sys.exit(main())``; ``python -m sftq_client`` does
    ``raise SystemExit(main())``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    server_argv = server_command_argv(args)
    if server_argv is not None:
        return run_server_command(server_argv)

    parser = _build_parser()
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:  # argparse exits on --help, --version and usage errors
        return _exit_status(exc.code)
    if ns.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if ns.command in SERVER_COMMANDS:  # unreachable after _server_command_argv; kept as a guard
        return run_server_command([ns.command, *ns.rest])

    ctx = Context(ns, client_factory, stderr_tty=_stderr_is_tty())
    try:
        handler: Handler = ns.handler
        return handler(ns, ctx)
    except (UsageError, ValueError) as exc:
        # ValueError: the client's own argument checks (an empty job id, a bad interval).
        err(f"error: {exc}")
        return EXIT_USAGE
    except SftqError as exc:
        _report(exc)
        return _exit_code_for(exc)
    except KeyboardInterrupt:
        err("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `sftq list | head`: the reader left. Point stdout at devnull so the interpreter's final
        # flush does not raise a second time, and exit quietly like other Unix tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    finally:
        ctx.close()
