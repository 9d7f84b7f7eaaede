"""``sftq analytics queue | summary | job``: read-only figures about one's jobs and the queue."""

from __future__ import annotations

import argparse
from datetime import UTC

from ..models import JobAnalytics, QueueContext, QueuedJob, Summary
from ._common import (
    EXIT_OK,
    ID_HELP,
    CommandFactory,
    Context,
    add_connection_options,
    add_json,
    basis_short,
    fields,
    fmt_duration,
    fmt_money,
    fmt_time,
    now_fields,
    one_line,
    out,
    print_json,
    resolve_job,
    table,
)


def _print_queue(ctx_: QueueContext) -> None:
    running = ctx_.your_progress_job
    if running is None:
        out("running: none")
    else:
        name = f"  {running.display_name}" if running.display_name else ""
        out(
            f"running: {running.id}  {running.kind}  {running.gpu_count} GPUs  "
            f"started {fmt_time(running.started_at)}{name}"
        )
    if ctx_.your_queued_jobs:
        out(f"queued ({len(ctx_.your_queued_jobs)}):")
        # AHEAD counts other users' jobs only: WHY says what holds the job (often your own
        # running or earlier job, which AHEAD does not count), START when it should start.
        out(
            table(
                ("ID", "KIND", "GPUS", "CREATED", "AHEAD", "NAME", "START", "WHY"),
                [
                    [q.id, q.kind, q.gpu_count, q.created_at, q.queue_position, q.display_name,
                     _start(q), _why(q)]
                    for q in ctx_.your_queued_jobs
                ],
            )
        )
        # What the START estimates rest on, in a few words (the sentences are in --json).
        bases = dict.fromkeys(basis_short(q.estimate.basis) for q in ctx_.your_queued_jobs
                              if q.estimate and q.estimate.basis)
        for basis in bases:
            out(f"estimates: {basis}")
    else:
        out("queued: none")
    out(
        f"everyone: {ctx_.global_queue_depth} queued, {ctx_.global_progress_count} running, "
        f"{ctx_.global_gpu_in_use} GPUs in use"
    )


def _why(q: QueuedJob) -> str:
    reason = q.waiting_reason
    if reason is None:
        return "-"
    return one_line(reason.message or reason.code, 200) or reason.code


def _start(q: QueuedJob) -> str:
    return "-" if q.estimated_start_at is None else \
        q.estimated_start_at.astimezone(UTC).strftime("%m-%d %H:%MZ")


def _print_summary(summary: Summary) -> None:
    rate = "-" if summary.success_rate is None else f"{summary.success_rate:.1%}"
    by_state = ", ".join(f"{k} {v}" for k, v in summary.by_state.items()) or "-"
    by_kind = ", ".join(f"{k} {v}" for k, v in summary.by_kind.items()) or "-"
    out(
        fields(
            [
                ("total", summary.total),
                ("by state", by_state),
                ("by kind", by_kind),
                ("success rate", rate),
                ("avg run", fmt_duration(summary.avg_run_duration_seconds)),
                ("GPU hours", f"{summary.total_gpu_hours:.2f}"),
            ]
        )
    )
    if summary.recent_failures:
        out("")
        out("recent failures:")
        out(
            table(
                ("ID", "KIND", "GPUS", "FAILED", "NAME", "ERROR"),
                [
                    [f.id, f.kind, f.gpu_count, f.failed_at, f.display_name, one_line(f.error)]
                    for f in summary.recent_failures
                ],
            )
        )


def _print_job_analytics(a: JobAnalytics) -> None:
    gpu_hours = None if a.gpu_hours is None else f"{a.gpu_hours:.3f}"
    out(
        fields(
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
                ("queue_wait", fmt_duration(a.queue_wait_seconds)),
                ("run_duration", fmt_duration(a.run_duration_seconds)),
                ("gpu_hours", gpu_hours),
                ("error", a.error),
                *now_fields(a),
                *([("estimate_basis", a.estimate.basis)] if a.estimate else []),
                *([("estimated_cost", f"{fmt_money(a.estimated_cost)} (Fireworks' estimate)")]
                  if a.estimated_cost else []),
            ]
        )
    )


def _cmd_analytics(args: argparse.Namespace, ctx: Context) -> int:
    result: QueueContext | Summary | JobAnalytics
    if args.view == "queue":
        result = ctx.client.queue_context()
    elif args.view == "summary":
        result = ctx.client.summary()
    else:
        result = ctx.client.job_analytics(resolve_job(ctx, args.job_id))
    if args.json:
        print_json(result)
    elif isinstance(result, QueueContext):
        _print_queue(result)
    elif isinstance(result, Summary):
        _print_summary(result)
    else:
        _print_job_analytics(result)
    return EXIT_OK


# ---- server commands ----------------------------------------------------------------------------


def register(command: CommandFactory) -> None:
    p = command("analytics", "queue position, lifetime summary, per-job timing")
    views = p.add_subparsers(dest="view", metavar="<view>", title="views", required=True)
    for name, help_text in (
        ("queue", "your running and queued jobs, and the global queue"),
        ("summary", "lifetime totals over your jobs"),
        ("job", "timing and GPU cost of one job"),
    ):
        v = views.add_parser(name, help=help_text, description=help_text)
        if name == "job":
            v.add_argument("job_id", metavar="ID", help=ID_HELP)
        add_connection_options(v, top_level=False)
        add_json(v)
    p.set_defaults(handler=_cmd_analytics)
