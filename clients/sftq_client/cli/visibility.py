"""``sftq events ID | capacity``: a job's history, and the queue's capacity."""

from __future__ import annotations

import argparse

from ..models import Capacity
from ._common import (
    EXIT_OK,
    ID_HELP,
    CommandFactory,
    Context,
    add_json,
    fields,
    fmt_time,
    one_line,
    out,
    print_json,
    resolve_job,
    table,
)


def _cmd_events(args: argparse.Namespace, ctx: Context) -> int:
    job_id = resolve_job(ctx, args.job_id)
    if args.follow:
        # Live, from the job's stream (cli.watch), until the job ends.
        from .watch import follow_events

        return follow_events(ctx, job_id, as_json=args.json)
    events = ctx.client.list_events(job_id)
    if args.json:
        print_json(events)
    elif events:
        out(table(("ID", "TIME", "TYPE", "STATE", "MESSAGE"),
                  [[e.id, e.created_at, e.type, e.state, one_line(e.message, 200)]
                   for e in events]))
    else:
        out("no events")
    return EXIT_OK


def _print_capacity(c: Capacity) -> None:
    q = c.quota
    if q.limit is None:
        quota = f"{q.id}: not read yet"
    else:
        usage = "-" if q.usage is None else f"{q.usage:g}"
        quota = f"{q.id}: limit {q.limit}, usage {usage} (read {fmt_time(q.read_at)})"
    s = c.scheduler
    every = f"every {s.interval_seconds:g}s"
    health = "healthy" if s.healthy else "NOT RUNNING NORMALLY (waiting jobs cannot start)"
    out(fields([
        ("quota", quota),
        ("free GPUs", c.free_gpus),
        ("running", f"{c.running.jobs} jobs, {c.running.gpus} GPUs"),
        ("queued", f"{c.queued.jobs} jobs, {c.queued.gpus} GPUs"),
        ("scheduler", f"{health}; last tick {fmt_time(s.last_tick_at)} ({every})"),
    ]))
    if c.users:
        out("")
        out(table(("USER", "CAP", "RUNNING", "RUNNING GPUS", "QUEUED", "QUEUED GPUS"),
                  [[u.name, u.cap, u.running_jobs, u.running_gpus, u.queued_jobs, u.queued_gpus]
                   for u in c.users]))


def _cmd_capacity(args: argparse.Namespace, ctx: Context) -> int:
    capacity = ctx.client.capacity()
    if args.json:
        print_json(capacity)
    else:
        _print_capacity(capacity)
    return EXIT_OK


def register(command: CommandFactory) -> None:
    p = command("events", "a job's history, oldest first")
    p.add_argument("job_id", metavar="ID", help=ID_HELP)
    p.add_argument("--follow", action="store_true",
                   help="then keep printing its events as they happen, until it ends")
    add_json(p)
    p.set_defaults(handler=_cmd_events)

    p = command("capacity", "the GPU quota, what runs and waits, per user, and the scheduler")
    add_json(p)
    p.set_defaults(handler=_cmd_capacity)
