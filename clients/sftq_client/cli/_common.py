"""What every command group of the ``sftq`` CLI shares: exit codes, output, formatting, the
per-invocation context that builds the client, and argument helpers.

Human-readable tables go to stdout by default, ``--json`` prints machine JSON on stdout instead,
and every diagnostic goes to stderr, so ``sftq ... --json | jq`` always sees clean JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import BaseModel

from .._client import Client
from ..models import Job, JobAnalytics

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


def fmt_money(money: Any) -> str:
    """A google.type.Money ({"currencyCode", "units", "nanos"}) for a person: $0.17 for USD,
    12.50 EUR for another currency; a positive amount under a cent is "< $0.01"."""
    if not isinstance(money, dict):
        return "-"
    try:
        amount = int(money.get("units") or 0) + int(money.get("nanos") or 0) / 1e9
    except (TypeError, ValueError):
        return "-"
    code = str(money.get("currencyCode") or "USD").upper()

    def text(value: str) -> str:
        return f"${value}" if code == "USD" else f"{value} {code}"

    if 0 < amount < 0.005:
        return f"< {text('0.01')}"
    return ("-" if amount < 0 else "") + text(f"{abs(amount):.2f}")


_BASIS_RULES: Final = (
    (re.compile(r"^default run time of ([^:]+)"),
     lambda m: f"assumes a run of {m[1]}: no similar job finished lately"),
    (re.compile(r"^median run time of (\d+) \S+ jobs? on"),
     lambda m: f"median of {m[1]} similar run{'' if m[1] == '1' else 's'}"),
    (re.compile(r"^median run time of the (\d+) similar"),
     lambda m: f"median of {m[1]} longer similar run{'' if m[1] == '1' else 's'}"),
    (re.compile(r"^from the provider's progress"), lambda m: "from Fireworks' reported progress"),
    (re.compile(r"^the provider reports 100%"), lambda m: "Fireworks reports 100%"),
    (re.compile(r"^already running longer"), lambda m: "running longer than similar jobs"),
    (re.compile(r"^fixed run time of ([^;]+)"), lambda m: f"assumes {m[1]}"),
    (re.compile(r"^simulated strict-FIFO admission with (\d+) jobs? ahead.*"
                r"else a default of ([^;]+)$"),
     lambda m: f"simulated queue, {m[1]} ahead; a run with no history counts {m[2]}"),
    (re.compile(r"^simulated strict-FIFO admission with (\d+) jobs? ahead"),
     lambda m: f"simulated queue, {m[1]} ahead"),
    (re.compile(r"^extrapolated: (\d+)"), lambda m: f"extrapolated, {m[1]} ahead"),
    (re.compile(r"^no estimate: (.*)$"), lambda m: m[1]),
)


def basis_short(basis: str | None) -> str:
    """What an estimate rests on, in a few words to print beside it (the server's sentence,
    ``estimate.basis``, is in --json and `sftq analytics job`): "assumes a run of 60 minutes:
    no similar job finished lately"."""
    if not basis:
        return ""
    for pattern, say in _BASIS_RULES:
        match = pattern.search(basis)
        if match:
            return str(say(match))
    return basis


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
    """`name:  value` lines, aligned; an empty name continues the line above (a list)."""
    width = max(len(k) for k, _ in pairs) + 1
    return "\n".join(f"{(k + ':' if k else '').ljust(width)}  {fmt(v)}" for k, v in pairs)


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
    # Issue 44's fields, only when set: what the pre-flight found doubtful, and the cost.
    for i, finding in enumerate(job.warnings or []):
        pairs.append(("warnings" if i == 0 else "", f"{finding.path}: {finding.message}"))
    if job.estimated_cost is not None:
        pairs.append(("estimated_cost", f"{fmt_money(job.estimated_cost)} (Fireworks' estimate)"))
    # Issue 53's, only when set: the jobs it runs after, its bound on run time, a stall.
    if job.after:
        pairs.append(("after", ", ".join(job.after)))
    if job.max_run_seconds is not None:
        pairs.append(("max_run_seconds", job.max_run_seconds))
    if job.stalled:
        pairs.append(("stalled", f"no progress at Fireworks since {job.stalled_since}"))
    return pairs


def estimate_text(at: datetime | None, basis: str | None) -> str:
    """An estimated time with what it rests on, in a few words: "2026-05-01 11:00:00Z
    (estimate: assumes a run of 60 minutes: no similar job finished lately)"."""
    why = basis_short(basis)
    if at is None:
        return f"none ({why})" if why else "none"
    return f"{fmt_time(at)} (estimate: {why})" if why else f"{fmt_time(at)} (estimate)"


def now_fields(a: JobAnalytics) -> list[tuple[str, object]]:
    """What a job is doing now, from its analytics: while QUEUED why it waits, how many of
    others' jobs are ahead and when it should start; while PROGRESS the provider's state, the
    progress and when it should end; each estimate with its basis in a few words."""
    basis = a.estimate.basis if a.estimate else None
    pairs: list[tuple[str, object]] = []
    if a.state == "QUEUED":
        if a.waiting_reason is not None:
            pairs.append(("waiting_reason", a.waiting_reason.message or a.waiting_reason.code))
        if a.queue_position is not None:
            pairs.append(("queue_position", f"{a.queue_position} of other users' jobs ahead"))
        pairs.append(("estimated_start_at", estimate_text(a.estimated_start_at, basis)))
    elif a.state == "PROGRESS":
        pairs.append(("provider_state", a.provider_state or "submitting"))
        percent = a.progress.percent if a.progress else None
        if percent is not None:
            pairs.append(("progress", f"{percent:g}%"))
        pairs.append(("estimated_finish_at", estimate_text(a.estimated_finish_at, basis)))
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
