"""The live status line of ``sftq wait`` on a terminal.

One line, rewritten in place, with what a person wants while waiting: the state; while QUEUED
how many jobs are ahead, when it should start and why it waits; while PROGRESS the provider's
sub-state, progress and when it should end. It is fed by the job's stream (status, queue and
progress events) or, where the server does not stream, by each poll; the job's analytics fill
it in when the state changes (and at each poll). It is redrawn at least every ``REFRESH``
seconds, so the elapsed time and "starts in ..." stay current between events.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from ..errors import SftqError
from ..models import EndEvent, Job, JobAnalytics, ProgressEvent, QueueEvent, StatusEvent
from ._common import basis_short

REFRESH: Final = 5.0


def terminal_width() -> int:
    return shutil.get_terminal_size((100, 24)).columns


def coarse(seconds: float) -> str:
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


def when(verb: str, at: datetime | None, now: datetime) -> str:
    if at is None:
        return f"no estimate of when it {verb}"
    clock = at.astimezone(UTC).strftime("%H:%MZ")
    ahead = (at - now).total_seconds()
    rel = f"in {coarse(ahead)}" if ahead >= 1 else "any moment"
    return f"{verb} ~{clock} ({rel}, estimate)"


class LiveStatus:
    """Callable with a Job (a poll) or a stream event; draws the line; ``close()`` ends it.

    ``width`` is read at each draw (the terminal may be resized). Drawing happens under a lock:
    the refresh thread and the caller's thread share the stream.
    """

    def __init__(self, stream: TextIO, analytics: Callable[[str], JobAnalytics] | None,
                 *, width: Callable[[], int] | None = None, refresh: float = REFRESH) -> None:
        self._stream = stream
        self._analytics = analytics
        self._width = width
        self._refresh = refresh
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dirty = False
        self.job_id = ""
        self.last_state: str | None = None
        self._detail: dict[str, Any] = {}

    # -- feeding --------------------------------------------------------------------------

    def __call__(self, item: Job | StatusEvent | QueueEvent | ProgressEvent | EndEvent) -> None:
        with self._lock:
            if isinstance(item, Job):
                self._status(item, read=True)
            elif isinstance(item, StatusEvent):
                self._status(item.job, read=item.job.state != self.last_state)
            elif isinstance(item, QueueEvent):
                self._detail.update(queue_position=item.queue_position,
                                    waiting_reason=item.waiting_reason,
                                    estimated_start_at=item.estimated_start_at)
            elif isinstance(item, ProgressEvent):
                self._detail.update(provider_state=item.provider_state, progress=item.progress,
                                    estimated_finish_at=item.estimated_finish_at)
            self._draw()
        if self._thread is None:
            self._thread = threading.Thread(target=self._redraw, name="sftq-wait-line",
                                            daemon=True)
            self._thread.start()

    def _status(self, job: Job, *, read: bool) -> None:
        if job.state != self.last_state:
            self._detail = {}
        self.job_id, self.last_state = job.id, job.state
        if read and not job.is_terminal and self._analytics is not None:
            try:
                info = self._analytics(job.id)
            except SftqError:
                return  # the line is a nicety: a failed read must not end the wait
            if info.state == job.state:
                self._detail = {k: getattr(info, k) for k in (
                    "queue_position", "waiting_reason", "estimated_start_at", "provider_state",
                    "progress", "estimated_finish_at", "estimate")}

    # -- drawing --------------------------------------------------------------------------

    def line(self) -> str:
        parts = [self.job_id, self.last_state or ""]
        d = self._detail
        now = datetime.now(UTC)
        if not d:
            parts.append(f"(waiting {coarse(time.monotonic() - self._started)})")
        elif self.last_state == "QUEUED":
            if d.get("queue_position") is not None:
                parts.append(f"{d['queue_position']} ahead")
            parts.append(when("starts", d.get("estimated_start_at"), now))
            reason = d.get("waiting_reason")
            if reason is not None:
                parts.append(reason.message or reason.code)
            # Last, so that a narrow terminal cuts it first: what the estimate rests on.
            parts.append(self._basis())
        elif self.last_state == "PROGRESS":
            sub = (d.get("provider_state") or "").removeprefix("JOB_STATE_")
            progress = d.get("progress")
            if progress is not None and progress.percent is not None:
                sub += f" {progress.percent:g}%"
                if progress.epoch is not None:
                    sub += f" epoch {progress.epoch}"
            if sub.strip():
                parts.append(sub.strip())
            parts.append(when("ends", d.get("estimated_finish_at"), now))
            parts.append(self._basis())
        text = "  ".join(p for p in parts if p)
        width = max(40, (self._width or terminal_width)()) - 1
        return text if len(text) <= width else text[: width - 3] + "..."

    def _basis(self) -> str:
        # Frames carry no basis: the one the last analytics read gave stays (update() keeps it).
        estimate = self._detail.get("estimate")
        short = basis_short(estimate.basis) if estimate is not None else ""
        return f"(estimate: {short})" if short else ""

    def _draw(self) -> None:
        if not self.job_id:
            return
        self._stream.write(f"\r\x1b[K{self.line()}")
        self._stream.flush()
        self._dirty = True

    def _redraw(self) -> None:
        while not self._stop.wait(self._refresh):
            with self._lock:
                if self._stop.is_set():
                    return
                self._draw()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._dirty:
                self._stream.write("\n")
                self._stream.flush()
                self._dirty = False
