"""sftq_server.core.logs: lines written in batches, none lost, and the servers set logging up."""

from __future__ import annotations

import io
import logging
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sftq_server.core.logs import BatchedStreamHandler

ROOT = Path(__file__).resolve().parents[2]


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


def record(msg: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.makeLogRecord({"msg": msg, "levelno": level,
                                  "levelname": logging.getLevelName(level)})


def test_lines_wait_and_go_out_together_in_order() -> None:
    stream = CountingStream()
    h = BatchedStreamHandler(stream, interval=60)
    for i in range(100):
        h.handle(record(f"line {i}"))
    assert stream.writes == 0 and stream.getvalue() == ""
    h.flush()
    assert stream.writes == 1
    assert stream.getvalue().splitlines() == [f"line {i}" for i in range(100)]
    h.close()


def test_a_warning_goes_out_at_once_with_everything_before_it() -> None:
    stream = CountingStream()
    h = BatchedStreamHandler(stream, interval=60)
    h.handle(record("first"))
    h.handle(record("trouble", logging.WARNING))
    assert stream.getvalue().splitlines() == ["first", "trouble"]
    h.close()


def test_a_full_buffer_goes_out_at_once() -> None:
    stream = CountingStream()
    h = BatchedStreamHandler(stream, interval=60, max_buffer=1000)
    for _ in range(30):
        h.handle(record("x" * 49))  # 50 characters a line with its newline
    assert stream.writes == 1 and len(stream.getvalue()) == 1000
    h.close()
    assert len(stream.getvalue()) == 1500


def test_a_line_waits_at_most_about_the_interval() -> None:
    stream = CountingStream()
    h = BatchedStreamHandler(stream, interval=0.05)
    h.handle(record("soon"))
    deadline = time.monotonic() + 5
    while not stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.getvalue() == "soon\n"
    h.close()


def _child_logs(h: BatchedStreamHandler) -> None:
    h.handle(record("from the worker"))  # buffered; the interval is far away


def test_a_forked_worker_writes_what_waits_when_it_ends(tmp_path: Path) -> None:
    # granian's workers are multiprocessing children that end by os._exit: no atexit there.
    path = tmp_path / "out.log"
    with path.open("w") as f:
        h = BatchedStreamHandler(f, interval=600)
        ctx = multiprocessing.get_context("fork")
        p = ctx.Process(target=_child_logs, args=(h,))
        p.start()
        p.join(30)
        assert p.exitcode == 0
    assert path.read_text() == "from the worker\n"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter that imports our functions package."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(ROOT / "functions")})


@pytest.mark.parametrize("how", ["exit", "sys.exit(3)"])
def test_configure_logs_info_lines_alone_and_keeps_them_at_exit(how: str) -> None:
    code = ("import logging, sys\n"
            "from sftq_server import logs\n"
            "assert logs.configure()\n"
            "assert not logs.configure()  # once: a root handler is there now\n"
            "logging.getLogger('sftq.access').info('{\"a\": 1}')\n"
            "logging.getLogger('sftq.web').debug('not this')\n"
            + ("sys.exit(3)\n" if how != "exit" else ""))
    r = _python(code)
    assert r.returncode == (3 if how != "exit" else 0), r.stderr
    assert r.stderr == '{"a": 1}\n' and r.stdout == ""


def test_configure_leaves_a_deployment_s_own_logging_alone() -> None:
    code = ("import logging\n"
            "logging.basicConfig(level=logging.WARNING, format='own: %(message)s')\n"
            "from sftq_server import logs\n"
            "assert not logs.configure()\n"
            "logging.getLogger('sftq.access').info('dropped')\n"
            "logging.getLogger('sftq.web').warning('kept')\n")
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "own: kept\n"


def test_configure_leaves_the_host_s_own_log_formats_working() -> None:
    # gunicorn (under functions-framework) logs its errors as "[%(process)d] ...": after our
    # set-up that line must still format, not end in "--- Logging error ---".
    code = ("import logging, os, sys\n"
            "from sftq_server import logs\n"
            "assert logs.configure()\n"
            "host = logging.getLogger('gunicorn.error')\n"
            "h = logging.StreamHandler(sys.stdout)\n"
            "h.setFormatter(logging.Formatter('[%(process)d] [%(thread)d] %(message)s'))\n"
            "host.addHandler(h)\n"
            "host.propagate = False\n"
            "host.error('Worker (pid:%s) was sent %s!', 42, 'SIGKILL')\n"
            "print(os.getpid())\n")
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert "Logging error" not in r.stderr, r.stderr
    line, pid = r.stdout.splitlines()
    assert line.startswith(f"[{pid}] [") and line.endswith("] Worker (pid:42) was sent SIGKILL!")
