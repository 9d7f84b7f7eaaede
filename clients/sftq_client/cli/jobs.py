"""``sftq submit | list | get | cancel | wait | retry``: one's own jobs."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import islice
from typing import Any, Final

from .._transport import MIN_ID_PREFIX
from ..errors import SftqError
from ..models import KINDS, STATES, CancelResult, Job, RetryResult
from ..resources.stream import StreamUnavailable, wait_streaming
from ._common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REJECTED,
    ID_HELP,
    CommandFactory,
    Context,
    UsageError,
    add_json,
    add_wait_options,
    err,
    exit_for_job,
    fields,
    fmt_duration,
    fmt_money,
    fmt_time,
    job_fields,
    now_fields,
    one_line,
    out,
    positive_int,
    print_job,
    print_json,
    resolve_job,
    table,
    upper_choice,
)
from .live import REFRESH as LIVE_REFRESH
from .live import LiveStatus
from .watch import LiveLine

# The server's bounds for queue_timeout_seconds: 1 second to 30 days.
MAX_QUEUE_TIMEOUT: Final = 2_592_000
_DURATION_RE: Final = re.compile(r"(\d+)\s*([smhd]?)")
_UNIT_SECONDS: Final = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> int:
    match = _DURATION_RE.fullmatch(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: use a number with s, m, h or d (30m, 6h, 2d)"
        )
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def max_run(text: str) -> int:
    """``--max-run``: 90m, 12h or 2d, as seconds (60 s to 30 days)."""
    seconds = _duration(text)
    if not 60 <= seconds <= MAX_QUEUE_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"{text!r} is out of range: a run bound is 60 seconds to 30 days"
        )
    return seconds


def queue_timeout(text: str) -> int:
    """``--queue-timeout``: 90, 90s, 30m, 6h or 2d, as seconds (1 s to 30 days)."""
    seconds = _duration(text)
    if not 1 <= seconds <= MAX_QUEUE_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"{text!r} is out of range: a queue timeout is 1 second to 30 days"
        )
    return seconds


_KIND_AT_START: Final = re.compile(r"(sft|dpo|rft)[-_]")
_KIND_AT_END: Final = re.compile(r"[-_](sft|dpo|rft)$")


def kind_from_file_name(path: str) -> str | None:
    """The kind a payload file's name tells, for ``submit`` without ``--kind``: its stem (the
    name without its last extension) is sft, dpo or rft in any case, or starts with one followed
    by - or _, or ends with one after - or _ (``examples/sft.json``, ``DPO-run.json``,
    ``my_rft.json``). None when it tells none, or two (``sft-to-dpo.json``), or for stdin."""
    if path == "-":
        return None
    stem = os.path.splitext(os.path.basename(path))[0].lower()
    if stem.upper() in KINDS:
        return stem.upper()
    found = {m.group(1) for m in (_KIND_AT_START.match(stem), _KIND_AT_END.search(stem)) if m}
    return found.pop().upper() if len(found) == 1 else None


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


def _follow(ctx: Context, job_id: str, *, interval: float, timeout: float | None,
            line: Callable[[Any], None]) -> Job:
    """Wait through the job's stream (each change within about a second); where the server does
    not stream, poll, at least every LIVE_REFRESH seconds on a terminal (the live line shows
    what each poll reads)."""
    try:
        return wait_streaming(ctx.client, job_id, timeout=timeout, on_event=line)
    except StreamUnavailable:
        tty = ctx.stderr_tty
        return ctx.client.wait(
            job_id,
            poll_interval=min(interval, LIVE_REFRESH) if tty else interval,
            max_interval=LIVE_REFRESH if tty else max(60.0, interval),
            timeout=timeout,
            on_progress=line,
        )


def _wait_and_report(
    ctx: Context, job_id: str, *, interval: float, timeout: float | None, as_json: bool
) -> int:
    # On a terminal, one live line with the reasons and estimates (cli.live); else a line per
    # change (cli.watch.LiveLine, the stream's wording).
    live = LiveStatus(sys.stderr, ctx.client.job_analytics) if ctx.stderr_tty else None
    plain = LiveLine(sys.stderr, False)
    last: dict[str, str] = {}

    def line(item: Any) -> None:
        job = item if isinstance(item, Job) else getattr(item, "job", None)
        if isinstance(job, Job):
            last["state"] = job.state
        (live or plain)(item)

    try:
        job = _follow(ctx, job_id, interval=interval, timeout=timeout, line=line)
    except KeyboardInterrupt:
        if live is not None:
            live.close()
        still = f" (still {last['state']})" if "state" in last else ""
        err(f"stopped waiting; job {job_id} is unaffected{still}. "
            f"Resume with: sftq wait {job_id}   (cancel it with: sftq cancel {job_id})")
        return EXIT_INTERRUPTED
    finally:
        if live is not None:
            live.close()
        plain.close()
    print_job(job, as_json)
    return exit_for_job(job)


def _cmd_submit(args: argparse.Namespace, ctx: Context) -> int:
    kind = args.kind or kind_from_file_name(args.payload)
    if kind is None:
        raise UsageError("--kind SFT|DPO|RFT is required (it could not be told from the file name)")
    payload = _read_payload(args.payload, kind)
    if args.dry_run:
        return _dry_run(args, ctx, kind, payload)
    result = ctx.client.submit(
        kind,
        payload,
        display_name=args.display_name,
        gpu_count=args.gpu_count,
        idempotency_key=args.idempotency_key,
        queue_timeout_seconds=args.queue_timeout,
        validate=not args.no_validate,
        after=args.after,
        max_run_seconds=args.max_run,
    )
    for warning in result.warnings:
        err(f"warning: {warning.message}")
    if args.wait:
        # The id goes to stderr first so it is not lost if the wait is interrupted.
        err(f"queued {result.id} ({result.kind}); waiting for it to finish")
        return _wait_and_report(
            ctx, result.id, interval=args.interval, timeout=args.timeout, as_json=args.json
        )
    if args.json:
        # As the server answers it: `warnings` and `estimated_cost` only when there are some.
        absent = {name for name in ("warnings", "estimated_cost", "after", "max_run_seconds")
                  if not getattr(result, name)}
        shown = result.model_dump(mode="json", exclude=absent or None)
        out(json.dumps(shown, indent=2))
    else:
        out(f"queued {result.id} ({result.kind}) at {fmt_time(result.created_at)}")
        if result.after:
            out(f"waiting_for_dependency: it starts once {', '.join(result.after)} "
                f"{'has' if len(result.after) == 1 else 'have all'} succeeded "
                "(and is cancelled if one fails or is cancelled)")
        out(f"follow it with: sftq wait {result.id}")
    return EXIT_OK


def _dry_run(args: argparse.Namespace, ctx: Context, kind: str, payload: Any) -> int:
    """`sftq submit --dry-run`: every pre-flight check, nothing enqueued; exit 0 when the job
    would be accepted, EXIT_REJECTED when not."""
    result = ctx.client.validate(
        kind,
        payload,
        display_name=args.display_name,
        gpu_count=args.gpu_count,
        queue_timeout_seconds=args.queue_timeout,
    )
    if args.json:
        print_json(result)
    else:
        for finding in result.errors:
            out(f"error: {finding.message}")
        for finding in result.warnings:
            out(f"warning: {finding.message}")
        if result.estimated_cost:
            out(f"estimated cost: {fmt_money(result.estimated_cost)}")
        verdict = "would be accepted" if result.valid else "would be refused"
        asked = {"done": "; its dataset, evaluator and models checked at Fireworks",
                 "unanswered": "; Fireworks did not answer in time, the scheduler would check "
                               "its resources while it waits",
                 "skipped": "; Fireworks not asked: fix the errors first"}.get(
                     result.provider_checks or "", "")
        out(f"{result.kind} job {verdict} (checked against {result.schema_version}{asked}); "
            "nothing was enqueued")
    return EXIT_OK if result.valid else EXIT_REJECTED


# What a plain `sftq list` shows: the newest jobs, with a note when more exist.
LIST_PAGE: Final = 100


_WIDE_COLUMNS: Final = ("ID", "KIND", "STATE", "GPUS", "CREATED", "STARTED", "COMPLETED", "NAME")
_COLUMNS: Final = ("ID", "KIND", "STATE", "GPUS", "CREATED", "RAN", "NAME")
# `sftq list` fits a terminal this wide unless --wide.
LIST_WIDTH: Final = 100


def _wide_row(job: Job) -> list[object]:
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


def short_ids(jobs: list[Job]) -> dict[str, str]:
    """Each id cut to the shortest prefix (8 characters at least) that tells these jobs apart:
    what `get`, `cancel`, `wait` and the rest accept."""
    n = MIN_ID_PREFIX
    while len({j.id[:n] for j in jobs}) < len({j.id for j in jobs}):
        n += 1
    return {j.id: j.id[:n] for j in jobs}


def _ran(job: Job, now: datetime) -> str:
    """How long it has run (or ran): from admission to its end, or to now."""
    if job.started_at is None:
        return "-"
    end = job.completed_at or now
    return fmt_duration(max(0.0, (end - job.started_at).total_seconds()))


def _narrow_table(jobs: list[Job]) -> str:
    ids = short_ids(jobs)
    now = datetime.now(UTC)
    cells = [
        [
            ids[j.id],
            j.kind,
            j.state,
            str(j.gpu_count),
            j.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
            _ran(j, now),
        ]
        for j in jobs
    ]
    # The name is last and takes what is left of the width, cut with "..." when longer.
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(_COLUMNS[:-1])]
    room = max(LIST_WIDTH - sum(w + 2 for w in widths), len("NAME"))
    rows: list[list[object]] = [
        [*r, one_line(j.display_name, room)] for r, j in zip(cells, jobs, strict=True)
    ]
    return table(_COLUMNS, rows)


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
    elif jobs and args.wide:
        out(table(_WIDE_COLUMNS, [_wide_row(j) for j in jobs]))
    elif jobs:
        out(_narrow_table(jobs))
    else:
        out("no jobs")
    if more:
        err(f"showing the newest {len(jobs)} jobs; more exist: use --all or --limit N")
    return EXIT_OK


def _cmd_get(args: argparse.Namespace, ctx: Context) -> int:
    job = ctx.client.get(resolve_job(ctx, args.job_id))
    if args.json:
        print_json(job)
        return EXIT_OK
    pairs = job_fields(job)
    if not job.is_terminal:
        # What it is doing now (why it waits, when it should start or end, and on what that
        # estimate rests), as the why-waiting API tells it. A server without it: the record.
        with contextlib.suppress(SftqError):
            pairs += now_fields(ctx.client.job_analytics(job.id))
    out(fields(pairs))
    return EXIT_OK


def _cmd_cancel(args: argparse.Namespace, ctx: Context) -> int:
    result: CancelResult = ctx.client.cancel(resolve_job(ctx, args.job_id))
    if args.json:
        print_json(result)
    elif result.pending:
        why = result.message or "the scheduler finishes the cancel at its next tick"
        out(f"cancel requested for {result.id} (still {result.state}): {why}")
    else:
        out(f"cancelled {result.id}")
    return EXIT_OK


def _cmd_retry(args: argparse.Namespace, ctx: Context) -> int:
    result: RetryResult = ctx.client.retry(resolve_job(ctx, args.job_id),
                                           idempotency_key=args.idempotency_key)
    if args.wait:
        err(f"queued {result.id} ({result.kind}), a retry of {result.retry_of}; "
            "waiting for it to finish")
        return _wait_and_report(
            ctx, result.id, interval=args.interval, timeout=args.timeout, as_json=args.json
        )
    if args.json:
        print_json(result)
    else:
        out(f"queued {result.id} ({result.kind}), a retry of {result.retry_of}, "
            f"at {fmt_time(result.created_at)}")
        out(f"follow it with: sftq wait {result.id}")
    return EXIT_OK


def _cmd_wait(args: argparse.Namespace, ctx: Context) -> int:
    return _wait_and_report(
        ctx,
        resolve_job(ctx, args.job_id),
        interval=args.interval,
        timeout=args.timeout,
        as_json=args.json,
    )


def register(command: CommandFactory) -> None:
    p = command("submit", "enqueue a fine-tuning job")
    p.add_argument(
        "--kind",
        type=upper_choice(KINDS),
        help="SFT, DPO or RFT (any case); default: the one the payload file's name tells "
        "(sft.json, dpo-run.json, my_rft.json)",
    )
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
    p.add_argument(
        "--queue-timeout",
        type=queue_timeout,
        metavar="DURATION",
        help="cancel the job if it is still queued after DURATION (e.g. 30m, 6h, 2d; "
        "1 second to 30 days)",
    )
    p.add_argument(
        "--after",
        action="append",
        metavar="ID",
        help="start only after your job ID has succeeded (repeatable, up to 20; a prefix of "
        "8+ characters will do); the job is cancelled if ID fails or is cancelled",
    )
    p.add_argument(
        "--max-run",
        type=max_run,
        metavar="DURATION",
        help="stop the job at Fireworks if it runs longer than DURATION (e.g. 90m, 12h, 2d; "
        "60 seconds to 30 days); it then ends CANCELLED (run_timeout)",
    )
    p.add_argument("--wait", action="store_true", help="then wait for the job like `sftq wait`")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="run the queue's pre-flight checks on the job and enqueue nothing "
        "(exit 0: it would be accepted; 7: it would be refused)",
    )
    p.add_argument(
        "--no-validate",
        action="store_true",
        help='skip the pre-flight check of the payload (sends "validate": "off")',
    )
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
    p.add_argument(
        "--wide",
        action="store_true",
        help=f"full ids and timestamps (default: fits {LIST_WIDTH} columns, short ids)",
    )
    add_json(p)
    p.set_defaults(handler=_cmd_list)

    p = command("get", "show one job")
    p.add_argument("job_id", metavar="ID", help=ID_HELP)
    add_json(p)
    p.set_defaults(handler=_cmd_get)

    p = command("cancel", "cancel a queued or running job")
    p.add_argument("job_id", metavar="ID", help=ID_HELP)
    add_json(p)
    p.set_defaults(handler=_cmd_cancel)

    p = command("retry", "enqueue a FAIL or CANCELLED job again, as a new job")
    p.add_argument("job_id", metavar="ID", help=ID_HELP)
    p.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="reuse KEY to make re-running this exact command safe (default: a fresh UUID)",
    )
    p.add_argument("--wait", action="store_true", help="then wait for the new job")
    add_wait_options(p)
    add_json(p)
    p.set_defaults(handler=_cmd_retry)

    p = command("wait", "wait until a job is SUCCESS, FAIL or CANCELLED")
    p.add_argument("job_id", metavar="ID", help=ID_HELP)
    add_wait_options(p)
    add_json(p)
    p.set_defaults(handler=_cmd_wait)
