"""How our servers log: each record's message alone, one line on stderr (the access log's
lines are JSON already), INFO and above.

`configure()` is called by every entry point that owns its process: the gateway (the image's
CMD, `sftq dev`), each functions-framework entry module when it builds its handler on the
first request (jobs-api, analytics, scheduler-tick, webhook-deliver, jobs-stream, also under
granian and uvicorn), and the benchmark's servers, so what is measured is what is deployed.
A deployment that configured logging itself (a handler on the root logger) is left as it is.

The access log writes one line per request, so its cost is per request too. A line waits at
most `FLUSH_INTERVAL` seconds in a buffer and goes out with the others of that moment in one
write, instead of one write system call per request (nginx's `access_log ... buffer= flush=`);
a WARNING or worse goes out at once with everything before it, and so does the buffer when the
process ends. The LogRecord's process and thread fields stay collected although our format
prints none of them: the host's own loggers in the same process use them (gunicorn's error log
prints `[%(process)d]` and fails on every line without it), and they cost about 2 us a record.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing.util
import os
import sys
import threading
from typing import TextIO

FLUSH_INTERVAL = 0.2  # seconds a line may wait
MAX_BUFFER = 64 * 1024  # characters that make a write at once


class BatchedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler that writes its lines in batches: when `interval` has passed, when
    `max_buffer` characters wait, at a record of `flush_level` or worse, and on flush().

    The standard library's MemoryHandler buffers too, but hands its records one by one to a
    target StreamHandler that writes and flushes each line: the system call per line stays."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = FLUSH_INTERVAL,
                 max_buffer: int = MAX_BUFFER, flush_level: int = logging.WARNING) -> None:
        super().__init__(stream)
        self.interval = interval
        self.max_buffer = max_buffer
        self.flush_level = flush_level
        self._lines: list[str] = []
        self._size = 0
        self._wake = threading.Event()
        self._flusher_pid = 0  # the flusher thread runs in this process (0: none yet)

    def emit(self, record: logging.LogRecord) -> None:
        # Called with self.lock held (Handler.handle).
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        self._lines.append(line)
        self._size += len(line)
        if record.levelno >= self.flush_level or self._size >= self.max_buffer:
            self._write(record)
        elif self._flusher_pid != os.getpid():
            self._start_flusher()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write(None)

    def close(self) -> None:
        self._wake.set()
        self.flush()
        super().close()

    def _write(self, record: logging.LogRecord | None) -> None:
        if self._lines:
            text = "".join(self._lines)
            self._lines.clear()
            self._size = 0
            try:
                self.stream.write(text)
            except Exception:
                self.handleError(record or logging.makeLogRecord({"msg": text[:200]}))
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to do
            self.stream.flush()

    def _start_flusher(self) -> None:
        # Per process: a server that forks its workers after configuring logging starts one
        # in each worker at its first buffered line. What waits at exit is written then: at
        # the interpreter's exit (atexit), and at the end of a forked multiprocessing worker
        # (granian's), which leaves by os._exit without running atexit but runs
        # multiprocessing's finalizers.
        self._flusher_pid = os.getpid()
        self._wake = threading.Event()
        atexit.register(self.flush)
        multiprocessing.util.Finalize(self, self.flush, exitpriority=100)
        threading.Thread(target=self._flush_every_interval, name="sftq-log-flush",
                         daemon=True).start()

    def _flush_every_interval(self) -> None:
        wake = self._wake
        while not wake.wait(self.interval):
            self.flush()


def configure(level: int = logging.INFO, stream: TextIO | None = None) -> bool:
    """Log `level` and above to `stream` (stderr), one message per line, through a
    BatchedStreamHandler. Does nothing, and answers False, when the root logger already has
    a handler (the deployment's own configuration wins)."""
    root = logging.getLogger()
    if root.handlers:
        return False
    handler = BatchedStreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    return True
