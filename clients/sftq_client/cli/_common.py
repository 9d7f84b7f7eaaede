"""What every command group of the ``sftq`` CLI shares: exit codes, output, formatting, the
per-invocation context that builds the client, and argument helpers.

Human-readable tables go to stdout by default, ``--json`` prints machine JSON on stdout instead,
and every diagnostic goes to stderr, so ``sftq ... --json | jq`` always sees clean JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import BaseModel

from .._client import Client
from ..models import Job

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

ClientFactory = Callable[[str | None, str | None], Client]
# One subcommand's parser, made by the top-level parser with the shared connection options.
CommandFactory = Callable[[str, str], argparse.ArgumentParser]
# What a command's handler receives and returns (an exit code).
Handler = Callable[[argparse.Namespace, "Context"], int]


class UsageError(Exception):
    """A mistake in the command line or its input files: exit 2 without contacting the server."""


def out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def err(text: str) -> None:
    sys.stderr.write(text + "\n")


# ---- formatting ---------------------------------------------------------------------------------


def fmt_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_duration(seconds: float | None) -> str:
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


def fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return fmt_time(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    cells = [list(headers)] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    # The last column is not padded, so long display names do not leave trailing spaces.
    lines = [
        "  ".join(
            cell if i == len(row) - 1 else cell.ljust(widths[i]) for i, cell in enumerate(row)
        )
        for row in cells
    ]
    return "\n".join(lines)


def fields(pairs: Sequence[tuple[str, object]]) -> str:
    width = max(len(k) for k, _ in pairs) + 1
    return "\n".join(f"{(k + ':').ljust(width)}  {fmt(v)}" for k, v in pairs)


def print_json(value: BaseModel | Sequence[BaseModel]) -> None:
    if isinstance(value, BaseModel):
        data: Any = value.model_dump(mode="json")
    else:
        data = [item.model_dump(mode="json") for item in value]
    out(json.dumps(data, indent=2))


def job_fields(job: Job) -> list[tuple[str, object]]:
    pairs: list[tuple[str, object]] = [
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
    # Issue 10's fields, only when set: whether a FAIL is worth a retry, and what this retries.
    if job.failure_class is not None:
        pairs.append(("failure_class", job.failure_class))
    if job.retry_of is not None:
        pairs.append(("retry_of", job.retry_of))
    return pairs


def print_job(job: Job, as_json: bool) -> None:
    if as_json:
        print_json(job)
    else:
        out(fields(job_fields(job)))


def exit_for_job(job: Job) -> int:
    if job.state == "FAIL":
        return EXIT_JOB_FAILED
    if job.state == "CANCELLED":
        return EXIT_JOB_CANCELLED
    return EXIT_OK


def one_line(text: str | None, limit: int = 100) -> str | None:
    if text is None:
        return None
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# ---- the per-invocation context -----------------------------------------------------------------


class Context:
    """Creates the client on first use, so local checks (payload file, ...) never need a key."""

    def __init__(
        self, args: argparse.Namespace, factory: ClientFactory, *, stderr_tty: bool = False
    ) -> None:
        self._args = args
        self._factory = factory
        self._client: Client | None = None
        # Whether stderr is a terminal: progress lines are rewritten in place there.
        self.stderr_tty = stderr_tty

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self._factory(self._args.api_key, self._args.api_url)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


ID_HELP: Final = "the job's id, or its first 8 or more characters (as `sftq list` shows them)"


def resolve_job(ctx: Context, job_id: str) -> str:
    """The full id of one of the caller's jobs from what the user typed: a full id, or an
    unambiguous prefix of at least 8 characters (as `sftq list` shows them). Every command that
    takes a job ID goes through here. AmbiguousJobId lists the candidates (main() prints them)."""
    return ctx.client.resolve_job_id(job_id)


# ---- argument helpers ---------------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def upper_choice(choices: Sequence[str]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        value = text.upper()
        if value not in choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice {text!r} (choose from {', '.join(choices)})"
            )
        return value

    return convert


def add_connection_options(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
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


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def add_wait_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval",
        type=positive_float,
        default=5.0,
        metavar="S",
        help="seconds between the first polls; backs off to 60s while nothing changes (default "
        "5); on a terminal the live status line refreshes at least every 5s",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=None,
        metavar="S",
        help="give up after S seconds (exit 12); default: wait forever",
    )
