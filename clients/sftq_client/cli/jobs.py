"""``sftq submit | list | get | cancel | wait``: one's own jobs."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import islice
from typing import Any, Final, TextIO

from ..errors import SftqError
from ..models import KINDS, STATES, CancelResult, Job, JobAnalytics
from ._common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    CommandFactory,
    Context,
    UsageError,
    add_json,
    add_wait_options,
    err,
    exit_for_job,
    fmt_duration,
    fmt_time,
    out,
    positive_int,
    print_job,
    print_json,
    table,
    upper_choice,
)


def _read_payload(path: str, kind: str) -> dict[str, Any]:
    label = "stdin" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read payload file {label}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"payload file {label} is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"payload {label} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(
            f"payload {label} must hold a JSON object (the Fireworks request body), "
            f"not a JSON {type(data).__name__}"
        )
    if "fireworks_payload" in data:
        # The contract's curl examples show the whole envelope; people copy it. Sending it as-is
        # would nest the envelope inside fireworks_payload and fail later, at Fireworks.
        source = "FILE" if path == "-" else path
        raise UsageError(
            f"payload {label} holds a whole request body ({{kind, fireworks_payload, ...}}), but "
            "--payload takes only the Fireworks request body that goes inside fireworks_payload; "
            "kind, display name and GPU count are flags. Extract it, e.g.:\n"
            f"  jq .fireworks_payload {source} | sftq submit --kind {kind} --payload -"
        )
    return data


# On a terminal, wait's line is refreshed at least this often (seconds).
LIVE_REFRESH = 5.0


class _Progress:
    """wait()'s on_progress: one live status line on a terminal, else a line per change.

    The live line says what a person wants while waiting: the state; while QUEUED how many
    jobs are ahead, when it should start and why it waits; while PROGRESS the provider's
    sub-state, progress and when it should end. Those come from the job's analytics, read at
    each refresh; without them (an older server) the line shows the state alone.
    """

    def __init__(
        self,
        stream: TextIO,
        tty: bool,
        analytics: Callable[[str], JobAnalytics] | None = None,
    ) -> None:
        self._stream = stream
        self._tty = tty
        self._analytics = analytics
        self._started = time.monotonic()
        self.last_state: str | None = None
        self._dirty = False

    def __call__(self, job: Job) -> None:
        if self._tty:
            width = max(40, _terminal_width()) - 1
            line = self.live_line(job)
            if len(line) > width:
                line = line[: width - 3] + "..."
            self._stream.write(f"\r\x1b[K{line}")
            self._stream.flush()
            self._dirty = True
        elif job.state != self.last_state:
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._stream.write(f"{now} {job.id} {job.state}\n")
            self._stream.flush()
        self.last_state = job.state

    def live_line(self, job: Job) -> str:
        parts = [job.id, job.state]
        info = self._read_analytics(job)
        if info is None or info.state != job.state:
            waited = fmt_duration(time.monotonic() - self._started)
            return "  ".join([*parts, f"(waiting {waited})"])
        now = datetime.now(UTC)
        if job.state == "QUEUED":
            if info.queue_position is not None:
                parts.append(f"{info.queue_position} ahead")
            parts.append(_when("starts", info.estimated_start_at, now))
            if info.waiting_reason is not None:
                parts.append(info.waiting_reason.message)
        elif job.state == "PROGRESS":
            sub = (info.provider_state or "").removeprefix("JOB_STATE_")
            if info.progress is not None and info.progress.percent is not None:
                sub += f" {info.progress.percent:g}%"
                if info.progress.epoch is not None:
                    sub += f" epoch {info.progress.epoch}"
            if sub.strip():
                parts.append(sub.strip())
            parts.append(_when("ends", info.estimated_finish_at, now))
        return "  ".join(parts)

    def _read_analytics(self, job: Job) -> JobAnalytics | None:
        if self._analytics is None or job.is_terminal:
            return None
        try:
            return self._analytics(job.id)
        except SftqError:
            # The line is a nicety: a failed read must not end the wait.
            return None

    def close(self) -> None:
        if self._dirty:
            self._stream.write("\n")
            self._stream.flush()
            self._dirty = False


def _terminal_width() -> int:
    return shutil.get_terminal_size((100, 24)).columns


def _when(verb: str, at: datetime | None, now: datetime) -> str:
    if at is None:
        return f"no estimate of when it {verb}"
    clock = at.astimezone(UTC).strftime("%H:%MZ")
    ahead = (at - now).total_seconds()
    rel = f"in {_coarse(ahead)}" if ahead >= 1 else "any moment"
    return f"{verb} ~{clock} ({rel}, estimate)"


def _coarse(seconds: float) -> str:
    """A duration as precise as an estimate deserves: 40s, 25m, 3h05m, 2d04h."""
    total = int(round(seconds))
    if total < 60:
        return f"{total}s"
    minutes = total // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def _wait_and_report(
    ctx: Context, job_id: str, *, interval: float, timeout: float | None, as_json: bool
) -> int:
    tty = ctx.stderr_tty
    progress = _Progress(sys.stderr, tty, ctx.client.job_analytics if tty else None)
    poll = min(interval, LIVE_REFRESH) if tty else interval
    try:
        job = ctx.client.wait(
            job_id,
            poll_interval=poll,
            max_interval=LIVE_REFRESH if tty else max(60.0, interval),
            timeout=timeout,
            on_progress=progress,
        )
    except KeyboardInterrupt:
        progress.close()
        state = progress.last_state or "as it was"
        err(f"stopped waiting; job {job_id} is unaffected (still {state}). "
            f"Resume with: sftq wait {job_id}   (cancel it with: sftq cancel {job_id})")
        return EXIT_INTERRUPTED
    finally:
        progress.close()
    print_job(job, as_json)
    return exit_for_job(job)


def _cmd_submit(args: argparse.Namespace, ctx: Context) -> int:
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
        err(f"queued {result.id} ({result.kind}); waiting for it to finish")
        return _wait_and_report(
            ctx, result.id, interval=args.interval, timeout=args.timeout, as_json=args.json
        )
    if args.json:
        print_json(result)
    else:
        out(f"queued {result.id} ({result.kind}) at {fmt_time(result.created_at)}")
        out(f"follow it with: sftq wait {result.id}")
    return EXIT_OK


# What a plain `sftq list` shows: the newest jobs, with a note when more exist.
LIST_PAGE: Final = 100

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


def _cmd_list(args: argparse.Namespace, ctx: Context) -> int:
    more = False
    if args.all or args.limit is not None:
        page_size = 500 if args.limit is None else min(args.limit, 1000)
        jobs_iter = ctx.client.iter_jobs(state=args.state, kind=args.kind, page_size=page_size)
        jobs = list(jobs_iter if args.limit is None else islice(jobs_iter, args.limit))
    else:
        # A plain `sftq list` is one page of the newest jobs: GET /jobs without a limit would
        # answer every job, which is more than a table on a terminal wants.
        page = ctx.client.list_jobs(state=args.state, kind=args.kind, limit=LIST_PAGE)
        jobs, more = page.items, page.has_more
    if args.json:
        print_json(jobs)
    elif jobs:
        out(table(_JOB_COLUMNS, [_job_row(j) for j in jobs]))
    else:
        out("no jobs")
    if more:
        err(f"showing the newest {len(jobs)} jobs; more exist: use --all or --limit N")
    return EXIT_OK


def _cmd_get(args: argparse.Namespace, ctx: Context) -> int:
    print_job(ctx.client.get(args.job_id), args.json)
    return EXIT_OK


def _cmd_cancel(args: argparse.Namespace, ctx: Context) -> int:
    result: CancelResult = ctx.client.cancel(args.job_id)
    if args.json:
        print_json(result)
    elif result.pending:
        why = result.message or "the scheduler finishes the cancel at its next tick"
        out(f"cancel requested for {result.id} (still {result.state}): {why}")
    else:
        out(f"cancelled {result.id}")
    return EXIT_OK


def _cmd_wait(args: argparse.Namespace, ctx: Context) -> int:
    return _wait_and_report(
        ctx, args.job_id, interval=args.interval, timeout=args.timeout, as_json=args.json
    )


def register(command: CommandFactory) -> None:
    p = command("submit", "enqueue a fine-tuning job")
    p.add_argument("--kind", required=True, type=upper_choice(KINDS), help="SFT, DPO or RFT")
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
    add_wait_options(p)
    add_json(p)
    p.set_defaults(handler=_cmd_submit)

    p = command("list", "list your jobs, newest first")
    p.add_argument("--state", type=upper_choice(STATES), help="only jobs in this state")
    p.add_argument("--kind", type=upper_choice(KINDS), help="only jobs of this kind")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument(
        "--limit", type=positive_int, metavar="N", help="show at most N jobs (pages as needed)"
    )
    amount.add_argument("--all", action="store_true", help="show every job (follows all pages)")
    add_json(p)
    p.set_defaults(handler=_cmd_list)

    p = command("get", "show one job")
    p.add_argument("job_id", metavar="ID")
    add_json(p)
    p.set_defaults(handler=_cmd_get)

    p = command("cancel", "cancel a queued or running job")
    p.add_argument("job_id", metavar="ID")
    add_json(p)
    p.set_defaults(handler=_cmd_cancel)

    p = command("wait", "wait until a job is SUCCESS, FAIL or CANCELLED")
    p.add_argument("job_id", metavar="ID")
    add_wait_options(p)
    add_json(p)
    p.set_defaults(handler=_cmd_wait)
