"""``sftq watch`` (a live table of one's queued and running jobs) and the live half of
``sftq wait`` and ``sftq events ID --follow``: each reads the stream and falls back to polling
where the server does not stream."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Final, TextIO

from ..models import (
    TERMINAL_STATES,
    EndEvent,
    Event,
    Job,
    ProgressEvent,
    QueueEvent,
    StatusEvent,
    StreamEvent,
)
from ..resources.stream import StreamUnavailable, iter_stream
from ._common import (
    EXIT_OK,
    CommandFactory,
    Context,
    add_json,
    err,
    fmt,
    fmt_duration,
    one_line,
    positive_float,
    table,
)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe(event: StreamEvent) -> str:
    """One line for a person."""
    if isinstance(event, StatusEvent):
        job = event.job
        name = f" ({job.display_name})" if job.display_name else ""
        return f"{job.id} {job.state}{name}"
    if isinstance(event, ProgressEvent):
        pct = event.progress.percent if event.progress else None
        extra = f" {pct:g}%" if pct is not None else ""
        return f"{event.job_id} {event.provider_state or '-'}{extra}"
    if isinstance(event, QueueEvent):
        reason = f" ({event.waiting_reason.code})" if event.waiting_reason else ""
        start = f", estimated start {fmt(event.estimated_start_at)}" \
            if event.estimated_start_at else ""
        return f"{event.job_id} position {fmt(event.queue_position)}{reason}{start}"
    return f"{event.job_id or ''} end".strip()


def _event_json(event: StreamEvent) -> str:
    return json.dumps(event.model_dump(mode="json"))


# ---- sftq wait ----------------------------------------------------------------------------------

class LiveLine:
    """One line that follows a job: rewritten in place on a terminal, else a line per event."""

    def __init__(self, stream: TextIO, tty: bool) -> None:
        self._stream = stream
        self._tty = tty
        self._started = time.monotonic()
        self._state = ""
        self._detail = ""
        self._dirty = False

    def __call__(self, event: StreamEvent | Job) -> None:
        if isinstance(event, Job):
            event = StatusEvent(id="", job=event)
        if isinstance(event, StatusEvent):
            changed = event.job.state != self._state
            self._state = event.job.state
            self._detail = ""
            job_id = event.job.id
        elif isinstance(event, (ProgressEvent, QueueEvent)):
            changed = True
            self._detail = describe(event).split(" ", 1)[1]
            job_id = event.job_id
        else:
            return
        if self._tty:
            elapsed = fmt_duration(time.monotonic() - self._started)
            detail = f"  {self._detail}" if self._detail else ""
            self._stream.write(f"\r\x1b[K{job_id}  {self._state}{detail}  (waiting {elapsed})")
            self._stream.flush()
            self._dirty = True
        elif changed:
            self._stream.write(f"{_now()} {describe(event)}\n")
            self._stream.flush()

    def close(self) -> None:
        if self._dirty:
            self._stream.write("\n")
            self._stream.flush()
            self._dirty = False


# ---- sftq events ID --follow --------------------------------------------------------------------

class EventRows:
    """`sftq events` rows printed as they come: the header once, then a row per event (or with
    --json an Event object per line), each event once, oldest first."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.last_id: str | None = None
        self.last_state: str | None = None
        self._header = False

    def catch_up(self, ctx: Context, job_id: str) -> None:
        """Print the events that followed the last one printed."""
        for event in ctx.client.iter_events(job_id, after=self.last_id):
            self.print(event)

    def print(self, event: Event) -> None:
        if self.as_json:
            line = json.dumps(event.model_dump(mode="json"))
        else:
            if not self._header:
                sys.stdout.write(event_row("ID", "TIME", "TYPE", "STATE", "MESSAGE") + "\n")
                self._header = True
            line = event_row(event.id, fmt(event.created_at), event.type, event.state,
                             one_line(event.message, 200) or "")
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        self.last_id, self.last_state = event.id, event.state

    @property
    def ended(self) -> bool:
        return self.last_state in TERMINAL_STATES


def event_row(*cells: str) -> str:
    """One row of `sftq events --follow`: the columns of `sftq events`, at fixed widths (the
    rows are printed as they come, so they cannot be measured first)."""
    widths = (6, 20, 14, 9)
    return "  ".join([c.ljust(w) for c, w in zip(cells, widths, strict=False)] + [cells[-1]])


def follow_events(ctx: Context, job_id: str, *, as_json: bool, interval: float = 5.0,
                  last_event_id: str | None = None) -> int:
    """`sftq events ID --follow`: the job's events as `sftq events` prints them (rows, or an
    Event object per line with --json), the history first, then each new event as it happens,
    until the job ends. Each frame of the job's stream says something changed: the events that
    followed the last one printed are read then. Without a stream, they are read every
    `interval` seconds."""
    rows = EventRows(as_json)
    rows.catch_up(ctx, job_id)
    if rows.ended:
        return EXIT_OK
    try:
        for event in iter_stream(ctx.client, job_id, last_event_id):
            rows.catch_up(ctx, job_id)
            if isinstance(event, EndEvent) or rows.ended:
                break
    except StreamUnavailable:
        err("note: this server does not stream; reading the job's events every "
            f"{interval:g} s instead")
        while not rows.ended:
            time.sleep(interval)
            rows.catch_up(ctx, job_id)
    return EXIT_OK


# ---- sftq watch ---------------------------------------------------------------------------------

_COLUMNS: Final = ("ID", "STATE", "KIND", "GPUS", "WHERE", "NAME")


class Board:
    """The jobs `sftq watch` shows: queued and running ones, oldest first."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.detail: dict[str, str] = {}

    def apply(self, event: StreamEvent) -> bool:
        if isinstance(event, StatusEvent):
            job = event.job
            if job.is_terminal:
                changed = self.jobs.pop(job.id, None) is not None
                self.detail.pop(job.id, None)
                return changed
            old = self.jobs.get(job.id)
            self.jobs[job.id] = job
            if old is None or old.state != job.state:
                self.detail.pop(job.id, None)
            return True
        if isinstance(event, (ProgressEvent, QueueEvent)) and event.job_id in self.jobs:
            self.detail[event.job_id] = describe(event).split(" ", 1)[1]
            return True
        return False

    def render(self) -> str:
        rows = [[j.id, j.state, j.kind, j.gpu_count, self.detail.get(j.id, ""), j.display_name]
                for j in sorted(self.jobs.values(), key=lambda j: (j.created_at, j.id))]
        return table(_COLUMNS, rows) if rows else "no queued or running jobs"


def _cmd_watch(args: argparse.Namespace, ctx: Context) -> int:
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    board = Board()
    tty = sys.stdout.isatty() and not args.json

    def show(event: StreamEvent) -> None:
        if args.json:
            sys.stdout.write(_event_json(event) + "\n")
        elif tty:
            sys.stdout.write("\x1b[H\x1b[2J" + f"sftq watch  {_now()}\n\n" + board.render() + "\n")
        else:
            sys.stdout.write(f"{_now()} {describe(event)}\n")
        sys.stdout.flush()

    try:
        for event in iter_stream(ctx.client, None, deadline=deadline):
            if board.apply(event) or args.json:
                show(event)
    except TimeoutError:
        return EXIT_OK
    except StreamUnavailable:
        err(f"note: this server does not stream; polling every {args.interval:g}s")
        return _poll_watch(ctx, board, show, args.interval, deadline)
    return EXIT_OK


def _poll_watch(ctx: Context, board: Board, show: object, interval: float,
                deadline: float | None) -> int:
    assert callable(show)
    while deadline is None or time.monotonic() < deadline:
        current = {j.id: j for state in ("QUEUED", "PROGRESS")
                   for j in ctx.client.iter_jobs(state=state)}
        for job in list(board.jobs.values()):
            if job.id not in current:
                done = ctx.client.get(job.id)
                event = StatusEvent(id="", job=done)
                board.apply(event)
                show(event)
        for job in current.values():
            old = board.jobs.get(job.id)
            if old is None or old.state != job.state:
                event = StatusEvent(id="", job=job)
                board.apply(event)
                show(event)
        pause = interval if deadline is None else min(interval, deadline - time.monotonic())
        if pause > 0:
            time.sleep(pause)
    return EXIT_OK


def register(command: CommandFactory) -> None:
    p = command("watch", "a live table of your queued and running jobs (Ctrl-C to stop)")
    p.add_argument("--interval", type=positive_float, default=5.0, metavar="S",
                   help="seconds between polls where the server does not stream (default 5)")
    p.add_argument("--timeout", type=positive_float, default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C)")
    add_json(p)
    p.set_defaults(handler=_cmd_watch)
