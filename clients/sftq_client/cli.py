"""The ``sftq`` command line.

User commands (submit, list, get, cancel, wait, analytics) talk to the jobs-api through
:class:`sftq_client.Client`. Server commands (db, dev, simulator, tick, ticker, admin) belong to the
server package and are only dispatched from here; see ``_run_server_command``.

Human-readable tables go to stdout by default, ``--json`` prints machine JSON on stdout instead, and
every diagnostic goes to stderr, so ``sftq ... --json | jq`` always sees clean JSON. Exit codes are
listed in docs/cli.md and in the EXIT_* constants below.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from itertools import islice
from typing import Any, Final, TextIO

from pydantic import BaseModel

from ._client import Client
from ._version import __version__
from .errors import (
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
from .models import KINDS, STATES, CancelResult, Job, JobAnalytics, QueueContext, Summary

__all__ = ["EXIT_CODES", "SERVER_COMMANDS", "client_factory", "main"]

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAUTHORIZED: Final = 3
EXIT_NOT_FOUND: Final = 4
EXIT_CONFLICT: Final = 5
EXIT_UNAVAILABLE: Final = 6
EXIT_REJECTED: Final = 7
EXIT_JOB_FAILED: Final = 10
EXIT_JOB_CANCELLED: Final = 11
EXIT_WAIT_TIMEOUT: Final = 12
EXIT_INTERRUPTED: Final = 130

EXIT_CODES: Final[dict[int, str]] = {
    EXIT_OK: "success (for wait / submit --wait: the job ended SUCCESS)",
    EXIT_ERROR: "any other error",
    EXIT_USAGE: "usage error: bad arguments, unreadable payload file, missing API key or URL",
    EXIT_UNAUTHORIZED: "the API key was rejected (401/403)",
    EXIT_NOT_FOUND: "no such job, or not yours (404)",
    EXIT_CONFLICT: "conflict (409), e.g. cancelling a job that already finished",
    EXIT_UNAVAILABLE: "unreachable or failing after retries (connection, timeout, 429, 5xx)",
    EXIT_REJECTED: "the server rejected the request as invalid (400, 413, 415, 422)",
    EXIT_JOB_FAILED: "the waited-for job ended FAIL",
    EXIT_JOB_CANCELLED: "the waited-for job ended CANCELLED",
    EXIT_WAIT_TIMEOUT: "wait --timeout passed before the job finished",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}

# Implemented by sftq_server.cli.main(argv) -> int, which ships only with the server extras.
SERVER_COMMANDS: Final[dict[str, str]] = {
    "db": "[server] migrate and inspect the queue database",
    "dev": "[server] run the whole system locally (database, functions, simulator, ticker)",
    "simulator": "[server] run the Fireworks simulator",
    "tick": "[server] run one scheduler tick",
    "ticker": "[server] run scheduler ticks in a loop (local stand-in for pg_cron)",
    "admin": "[server] manage users and API keys",
    "serve": "[server] serve the three functions at /functions/v1/<name>",
}
# Import failures naming these come from a client-only install, not from a bug in the server code.
_SERVER_ONLY_MODULES: Final = frozenset(
    {"sftq_server", "psycopg", "psycopg_pool", "functions_framework", "werkzeug", "gunicorn"}
)


def _default_client_factory(api_key: str | None, api_url: str | None) -> Client:
    return Client(api_key=api_key, base_url=api_url)


# Every command builds its client through this name, so tests can swap in one with a mock transport.
client_factory: Callable[[str | None, str | None], Client] = _default_client_factory


class _UsageError(Exception):
    """A mistake in the command line or its input files: exit 2 without contacting the server."""


def _stderr_is_tty() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


# ---- formatting ---------------------------------------------------------------------------------


def _fmt_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return _fmt_time(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    cells = [list(headers)] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    # The last column is not padded, so long display names do not leave trailing spaces.
    lines = [
        "  ".join(
            cell if i == len(row) - 1 else cell.ljust(widths[i]) for i, cell in enumerate(row)
        )
        for row in cells
    ]
    return "\n".join(lines)


def _fields(pairs: Sequence[tuple[str, object]]) -> str:
    width = max(len(k) for k, _ in pairs) + 1
    return "\n".join(f"{(k + ':').ljust(width)}  {_fmt(v)}" for k, v in pairs)


def _print_json(value: BaseModel | Sequence[BaseModel]) -> None:
    if isinstance(value, BaseModel):
        data: Any = value.model_dump(mode="json")
    else:
        data = [item.model_dump(mode="json") for item in value]
    _out(json.dumps(data, indent=2))


def _job_fields(job: Job) -> list[tuple[str, object]]:
    return [
        ("id", job.id),
        ("kind", job.kind),
        ("state", job.state),
        ("display_name", job.display_name),
        ("gpu_count", job.gpu_count),
        ("created_at", job.created_at),
        ("started_at", job.started_at),
        ("completed_at", job.completed_at),
        ("fireworks_job_name", job.fireworks_job_name),
        ("error", job.error),
    ]


def _print_job(job: Job, as_json: bool) -> None:
    if as_json:
        _print_json(job)
    else:
        _out(_fields(_job_fields(job)))


def _exit_for_job(job: Job) -> int:
    if job.state == "FAIL":
        return EXIT_JOB_FAILED
    if job.state == "CANCELLED":
        return EXIT_JOB_CANCELLED
    return EXIT_OK


# ---- commands -----------------------------------------------------------------------------------


class _Context:
    """Creates the client on first use, so local checks (payload file, ...) never need a key."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = client_factory(self._args.api_key, self._args.api_url)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _read_payload(path: str, kind: str) -> dict[str, Any]:
    label = "stdin" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except OSError as exc:
        raise _UsageError(f"cannot read payload file {label}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _UsageError(f"payload file {label} is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _UsageError(
            f"payload {label} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise _UsageError(
            f"payload {label} must hold a JSON object (the Fireworks request body), "
            f"not a JSON {type(data).__name__}"
        )
    if "fireworks_payload" in data:
        # The contract's curl examples show the whole envelope; people copy it. Sending it as-is
        # would nest the envelope inside fireworks_payload and fail later, at Fireworks.
        source = "FILE" if path == "-" else path
        raise _UsageError(
            f"payload {label} holds a whole request body ({{kind, fireworks_payload, ...}}), but "
            "--payload takes only the Fireworks request body that goes inside fireworks_payload; "
            "kind, display name and GPU count are flags. Extract it, e.g.:\n"
            f"  jq .fireworks_payload {source} | sftq submit --kind {kind} --payload -"
        )
    return data


class _Progress:
    """wait()'s on_progress: one rewritten status line on a terminal, else a line per change."""

    def __init__(self, stream: TextIO, tty: bool) -> None:
        self._stream = stream
        self._tty = tty
        self._started = time.monotonic()
        self._last_state: str | None = None
        self._dirty = False

    def __call__(self, job: Job) -> None:
        if self._tty:
            elapsed = _fmt_duration(time.monotonic() - self._started)
            self._stream.write(f"\r\x1b[K{job.id}  {job.state}  (waiting {elapsed})")
            self._stream.flush()
            self._dirty = True
        elif job.state != self._last_state:
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._stream.write(f"{now} {job.id} {job.state}\n")
            self._stream.flush()
        self._last_state = job.state

    def close(self) -> None:
        if self._dirty:
            self._stream.write("\n")
            self._stream.flush()
            self._dirty = False


def _wait_and_report(
    ctx: _Context, job_id: str, *, interval: float, timeout: float | None, as_json: bool
) -> int:
    progress = _Progress(sys.stderr, _stderr_is_tty())
    try:
        job = ctx.client.wait(
            job_id,
            poll_interval=interval,
            max_interval=max(60.0, interval),
            timeout=timeout,
            on_progress=progress,
        )
    finally:
        progress.close()
    _print_job(job, as_json)
    return _exit_for_job(job)


def _cmd_submit(args: argparse.Namespace, ctx: _Context) -> int:
    payload = _read_payload(args.payload, args.kind)
    result = ctx.client.submit(
        args.kind,
        payload,
        display_name=args.display_name,
        gpu_count=args.gpu_count,
        idempotency_key=args.idempotency_key,
    )
    if args.wait:
        # The id goes to stderr first so it is not lost if the wait is interrupted.
        _err(f"queued {result.id} ({result.kind}); waiting for it to finish")
        return _wait_and_report(
            ctx, result.id, interval=args.interval, timeout=args.timeout, as_json=args.json
        )
    if args.json:
        _print_json(result)
    else:
        _out(f"queued {result.id} ({result.kind}) at {_fmt_time(result.created_at)}")
        _out(f"follow it with: sftq wait {result.id}")
    return EXIT_OK


_JOB_COLUMNS: Final = ("ID", "KIND", "STATE", "GPUS", "CREATED", "STARTED", "COMPLETED", "NAME")


def _job_row(job: Job) -> list[object]:
    return [
        job.id,
        job.kind,
        job.state,
        job.gpu_count,
        job.created_at,
        job.started_at,
        job.completed_at,
        job.display_name,
    ]


def _cmd_list(args: argparse.Namespace, ctx: _Context) -> int:
    more = False
    if args.all or args.limit is not None:
        # Only --all and --limit page: a plain `sftq list` is one request, like the contract's curl.
        page_size = 500 if args.limit is None else min(args.limit, 1000)
        jobs_iter = ctx.client.iter_jobs(state=args.state, kind=args.kind, page_size=page_size)
        jobs = list(jobs_iter if args.limit is None else islice(jobs_iter, args.limit))
    else:
        page = ctx.client.list_jobs(state=args.state, kind=args.kind)
        jobs, more = page.items, page.has_more
    if args.json:
        _print_json(jobs)
    elif jobs:
        _out(_table(_JOB_COLUMNS, [_job_row(j) for j in jobs]))
    else:
        _out("no jobs")
    if more:
        _err(f"showing the newest {len(jobs)} jobs; more exist: use --all or --limit N")
    return EXIT_OK


def _cmd_get(args: argparse.Namespace, ctx: _Context) -> int:
    _print_job(ctx.client.get(args.job_id), args.json)
    return EXIT_OK


def _cmd_cancel(args: argparse.Namespace, ctx: _Context) -> int:
    result: CancelResult = ctx.client.cancel(args.job_id)
    if args.json:
        _print_json(result)
    elif result.pending:
        why = result.message or "the scheduler finishes the cancel at its next tick"
        _out(f"cancel requested for {result.id} (still {result.state}): {why}")
    else:
        _out(f"cancelled {result.id}")
    return EXIT_OK


def _cmd_wait(args: argparse.Namespace, ctx: _Context) -> int:
    return _wait_and_report(
        ctx, args.job_id, interval=args.interval, timeout=args.timeout, as_json=args.json
    )


def _print_queue(ctx_: QueueContext) -> None:
    running = ctx_.your_progress_job
    if running is None:
        _out("running: none")
    else:
        name = f"  {running.display_name}" if running.display_name else ""
        _out(
            f"running: {running.id}  {running.kind}  {running.gpu_count} GPUs  "
            f"started {_fmt_time(running.started_at)}{name}"
        )
    if ctx_.your_queued_jobs:
        _out(f"queued ({len(ctx_.your_queued_jobs)}):")
        _out(
            _table(
                ("ID", "KIND", "GPUS", "CREATED", "AHEAD", "NAME"),
                [
                    [q.id, q.kind, q.gpu_count, q.created_at, q.queue_position, q.display_name]
                    for q in ctx_.your_queued_jobs
                ],
            )
        )
    else:
        _out("queued: none")
    _out(
        f"everyone: {ctx_.global_queue_depth} queued, {ctx_.global_progress_count} running, "
        f"{ctx_.global_gpu_in_use} GPUs in use"
    )


def _print_summary(summary: Summary) -> None:
    rate = "-" if summary.success_rate is None else f"{summary.success_rate:.1%}"
    by_state = ", ".join(f"{k} {v}" for k, v in summary.by_state.items()) or "-"
    by_kind = ", ".join(f"{k} {v}" for k, v in summary.by_kind.items()) or "-"
    _out(
        _fields(
            [
                ("total", summary.total),
                ("by state", by_state),
                ("by kind", by_kind),
                ("success rate", rate),
                ("avg run", _fmt_duration(summary.avg_run_duration_seconds)),
                ("GPU hours", f"{summary.total_gpu_hours:.2f}"),
            ]
        )
    )
    if summary.recent_failures:
        _out("")
        _out("recent failures:")
        _out(
            _table(
                ("ID", "KIND", "GPUS", "FAILED", "NAME", "ERROR"),
                [
                    [f.id, f.kind, f.gpu_count, f.failed_at, f.display_name, _one_line(f.error)]
                    for f in summary.recent_failures
                ],
            )
        )


def _one_line(text: str | None, limit: int = 100) -> str | None:
    if text is None:
        return None
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _print_job_analytics(a: JobAnalytics) -> None:
    gpu_hours = None if a.gpu_hours is None else f"{a.gpu_hours:.3f}"
    _out(
        _fields(
            [
                ("id", a.id),
                ("kind", a.kind),
                ("state", a.state),
                ("display_name", a.display_name),
                ("gpu_count", a.gpu_count),
                ("fireworks_job_name", a.fireworks_job_name),
                ("queued_at", a.timeline.queued_at),
                ("started_at", a.timeline.started_at),
                ("completed_at", a.timeline.completed_at),
                ("queue_wait", _fmt_duration(a.queue_wait_seconds)),
                ("run_duration", _fmt_duration(a.run_duration_seconds)),
                ("gpu_hours", gpu_hours),
                ("error", a.error),
            ]
        )
    )


def _cmd_analytics(args: argparse.Namespace, ctx: _Context) -> int:
    result: QueueContext | Summary | JobAnalytics
    if args.view == "queue":
        result = ctx.client.queue_context()
    elif args.view == "summary":
        result = ctx.client.summary()
    else:
        result = ctx.client.job_analytics(args.job_id)
    if args.json:
        _print_json(result)
    elif isinstance(result, QueueContext):
        _print_queue(result)
    elif isinstance(result, Summary):
        _print_summary(result)
    else:
        _print_job_analytics(result)
    return EXIT_OK


# ---- server commands ----------------------------------------------------------------------------


def _run_server_command(argv: list[str]) -> int:
    # The one deliberate seam between client and server: the client package never imports server
    # code at module level (a client-only install has no server package), but one `sftq` binary
    # serves both audiences, so server subcommands are resolved by name, only when asked for.
    hint = f"error: `sftq {argv[0]}` needs the server extras: pip install 'finetune-queue[server]'"
    try:
        server_cli = importlib.import_module("sftq_server.cli")
    except ImportError as exc:
        _err(hint)
        _err(f"({exc})")
        return EXIT_USAGE
    server_main: Callable[[list[str]], int | None] = server_cli.main
    try:
        code = server_main(argv)
    except ModuleNotFoundError as exc:
        # Server code imports its heavy dependencies lazily, so a missing extra can surface here.
        if (exc.name or "").split(".")[0] not in _SERVER_ONLY_MODULES:
            raise
        _err(hint)
        _err(f"({exc})")
        return EXIT_USAGE
    return EXIT_OK if code is None else int(code)


# ---- argument parsing ---------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _upper_choice(choices: Sequence[str]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        value = text.upper()
        if value not in choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice {text!r} (choose from {', '.join(choices)})"
            )
        return value

    return convert


def _add_connection_options(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    # Accepted both before and after the subcommand. Below the top level the default is SUPPRESS,
    # so a subcommand that does not repeat the option leaves the top-level value alone.
    default = None if top_level else argparse.SUPPRESS
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--api-key",
        default=default,
        metavar="KEY",
        help="API key (default: $SFTQ_API_KEY)",
    )
    group.add_argument(
        "--api-url",
        default=default,
        metavar="URL",
        help="jobs-api base URL (default: $SFTQ_API_URL, else $SUPABASE_URL/functions/v1/jobs-api)",
    )


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def _add_wait_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval",
        type=_positive_float,
        default=5.0,
        metavar="S",
        help="seconds between the first polls; backs off to 60s while nothing changes (default 5)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        metavar="S",
        help="give up after S seconds (exit 12); default: wait forever",
    )


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
    _add_connection_options(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", metavar="<command>", title="commands")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_connection_options(p, top_level=False)
        return p

    p = command("submit", "enqueue a fine-tuning job")
    p.add_argument("--kind", required=True, type=_upper_choice(KINDS), help="SFT, DPO or RFT")
    p.add_argument(
        "--payload",
        required=True,
        metavar="FILE",
        help="JSON file holding the Fireworks request body (the fireworks_payload object); "
        "- reads stdin",
    )
    p.add_argument("--display-name", metavar="NAME", help="name shown in list and status output")
    p.add_argument(
        "--gpu-count",
        type=int,
        metavar="N",
        help="GPUs the job will use, for admission (server default 4)",
    )
    p.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="reuse KEY to make re-running this exact command safe (default: a fresh UUID)",
    )
    p.add_argument("--wait", action="store_true", help="then wait for the job like `sftq wait`")
    _add_wait_options(p)
    _add_json(p)
    p.set_defaults(handler=_cmd_submit)

    p = command("list", "list your jobs, newest first")
    p.add_argument("--state", type=_upper_choice(STATES), help="only jobs in this state")
    p.add_argument("--kind", type=_upper_choice(KINDS), help="only jobs of this kind")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument(
        "--limit", type=_positive_int, metavar="N", help="show at most N jobs (pages as needed)"
    )
    amount.add_argument("--all", action="store_true", help="show every job (follows all pages)")
    _add_json(p)
    p.set_defaults(handler=_cmd_list)

    p = command("get", "show one job")
    p.add_argument("job_id", metavar="ID")
    _add_json(p)
    p.set_defaults(handler=_cmd_get)

    p = command("cancel", "cancel a queued or running job")
    p.add_argument("job_id", metavar="ID")
    _add_json(p)
    p.set_defaults(handler=_cmd_cancel)

    p = command("wait", "wait until a job is SUCCESS, FAIL or CANCELLED")
    p.add_argument("job_id", metavar="ID")
    _add_wait_options(p)
    _add_json(p)
    p.set_defaults(handler=_cmd_wait)

    p = command("analytics", "queue position, lifetime summary, per-job timing")
    views = p.add_subparsers(dest="view", metavar="<view>", title="views", required=True)
    for name, help_text in (
        ("queue", "your running and queued jobs, and the global queue"),
        ("summary", "lifetime totals over your jobs"),
        ("job", "timing and GPU cost of one job"),
    ):
        v = views.add_parser(name, help=help_text, description=help_text)
        if name == "job":
            v.add_argument("job_id", metavar="ID")
        _add_connection_options(v, top_level=False)
        _add_json(v)
    p.set_defaults(handler=_cmd_analytics)

    for name, help_text in SERVER_COMMANDS.items():
        # Listed so `sftq --help` shows them; their own parsing happens in sftq_server.cli.
        s = sub.add_parser(name, help=help_text, add_help=False)
        s.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


# ---- errors and entry point ---------------------------------------------------------------------


def _exit_code_for(exc: SftqError) -> int:
    if isinstance(exc, ConfigurationError):
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
    _err(f"error: {exc}")
    if exc.details is not None:
        _err(f"details: {json.dumps(exc.details, default=str)}")
    if isinstance(exc, Unauthorized):
        _err("hint: check SFTQ_API_KEY (or --api-key); keys start with sftq_")
    elif isinstance(exc, (RateLimited, ServerError)) and exc.retry_after is not None:
        _err(f"hint: the server asked to retry after {exc.retry_after:g}s")


def _server_command_argv(args: list[str]) -> list[str] | None:
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
    server_argv = _server_command_argv(args)
    if server_argv is not None:
        return _run_server_command(server_argv)

    parser = _build_parser()
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:  # argparse exits on --help, --version and usage errors
        return _exit_status(exc.code)
    if ns.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if ns.command in SERVER_COMMANDS:  # unreachable after _server_command_argv; kept as a guard
        return _run_server_command([ns.command, *ns.rest])

    ctx = _Context(ns)
    try:
        handler: Callable[[argparse.Namespace, _Context], int] = ns.handler
        return handler(ns, ctx)
    except (_UsageError, ValueError) as exc:
        # ValueError: the client's own argument checks (an empty job id, a bad interval).
        _err(f"error: {exc}")
        return EXIT_USAGE
    except SftqError as exc:
        _report(exc)
        return _exit_code_for(exc)
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `sftq list | head`: the reader left. Point stdout at devnull so the interpreter's final
        # flush does not raise a second time, and exit quietly like other Unix tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    finally:
        ctx.close()
