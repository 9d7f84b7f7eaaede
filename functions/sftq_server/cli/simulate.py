"""`sftq simulate TRACE`: replay a trace through the real admission on a virtual clock.

`--compare A B` replays the same trace under two settings; each side is a comma-separated
list of key=value over the command's own flags (cap, quota, tick-interval, event-admission,
max-queued, wait-threshold; `cap=alice:3` for one user), e.g.
`sftq simulate trace.csv --compare cap=1 cap=2`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {text}")
    return value


def _switch(text: str) -> bool:
    if text.lower() not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"must be on or off, not {text!r}")
    return text.lower() == "on"


def _options(args: argparse.Namespace) -> Any:
    from sftq_server.simulate.engine import Options

    cap = 1
    caps: dict[str, int] = {}
    for item in args.cap or []:
        user, eq, n = item.rpartition("=")
        try:
            if eq:
                caps[user] = int(n)
            else:
                cap = int(n)
        except ValueError:
            raise SystemExit(f"error: --cap {item!r}: give N or USER=N") from None
    return Options(cap=cap, caps=caps, quota=args.quota, tick_interval=args.tick_interval,
                   event_admission=args.event_admission, max_queued=args.max_queued,
                   wait_threshold=args.wait_threshold)


def _generate(args: argparse.Namespace) -> int:
    from sftq_server.simulate.generate import generate_command, generate_from_args
    from sftq_server.simulate.trace import write_trace

    try:
        trace = generate_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_trace(trace, args.generate, comment=generate_command(args, args.generate))
    print(f"wrote {len(trace.jobs)} jobs to {args.generate}")
    return 0


def _cmd(args: argparse.Namespace) -> int:
    if args.generate:
        return _generate(args)
    if not args.trace:
        print("error: give a TRACE to replay (or --generate FILE to write one)", file=sys.stderr)
        return 2
    import logging

    # The tick logs every provider fault and retry; a replay reports them in its figures.
    logging.getLogger("sftq_server").setLevel(logging.INFO if args.verbose else logging.ERROR)
    from sftq_server.simulate import report
    from sftq_server.simulate.engine import ReplayError, compare, replay, with_overrides
    from sftq_server.simulate.trace import TraceError, load_trace

    try:
        trace = load_trace(args.trace)
    except (TraceError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    base = _options(args)
    try:
        if args.compare:
            sides = [with_overrides(base, spec) for spec in args.compare]
            results = compare(trace, sides)
        else:
            results = [replay(trace, base)]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ReplayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        try:
            from sftq_server.simulate.plot import plot
        except ImportError as exc:
            print(f"error: --plot needs the plotting extra ({exc})", file=sys.stderr)
            return 2
        plot(results[0], args.plot)
    if args.json:
        print(json.dumps(results if args.compare else results[0], indent=2))
    elif args.compare:
        print(report.side_by_side(results))
    else:
        print(report.table(results[0]))
    return 1 if any(r["violations"] for r in results) else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "simulate", help="replay a trace of jobs through the real admission on a virtual clock",
        description="Replay TRACE (CSV or JSON lines: submit_at, user, kind, gpu_count, "
        "run_seconds, optional outcome, outcome_at, after) through the queue's own SQL "
        "admission and scheduler tick, against a throw-away PostgreSQL and the Fireworks "
        "simulator, on a virtual clock; print waits per user, fairness, utilisation and the "
        "GPUs left idle because the head of the queue did not fit. Invariants (quota, caps, "
        "FIFO, one end per job, one create per job) are checked at every tick; a violation "
        "exits 1. Rate limits (FIREWORKS_RPM, Retry-After) do not apply to a replay.")
    p.add_argument("trace", nargs="?", help="the trace file")
    p.add_argument("--cap", action="append", metavar="N|USER=N",
                   help="every user's cap (running jobs), or one user's; repeatable "
                   "(default 1)")
    p.add_argument("--quota", type=_count, default=8, help="the GPU quota (default 8)")
    p.add_argument("--tick-interval", type=_positive, default=30.0,
                   help="seconds between periodic ticks (default 30)")
    p.add_argument("--event-admission", type=_switch, default=True, metavar="on|off",
                   help="woken ticks after submits, cancels and ends (default on)")
    p.add_argument("--max-queued", type=_count, default=None,
                   help="per-user limit on queued jobs (needs the per-user limits)")
    p.add_argument("--wait-threshold", type=_positive, default=3600.0,
                   help="count the jobs that waited longer than this many seconds "
                   "(default 3600)")
    p.add_argument("--compare", nargs=2, metavar="SETTINGS",
                   help="replay twice and print side by side; each side is key=value[,...] "
                   "over the flags above, e.g. --compare cap=1 cap=2")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="log every tick")
    p.add_argument("--plot", metavar="FILE.svg",
                   help="draw queue depth, GPUs in use and the waits per user")
    p.add_argument("--generate", metavar="FILE",
                   help="write a synthetic trace (the flags below) and stop")
    from sftq_server.simulate.generate import add_generate_arguments

    add_generate_arguments(p)
    p.set_defaults(func=_cmd)
