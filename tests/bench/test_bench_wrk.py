"""Without wrk the benchmark does not judge HTTP ratios: they are printed as n/c with a note.

The Python load generator shares the machine's two cores with the server it measures, so its
HTTP figures are depressed; a run without wrk must say so instead of printing MISSED or ok.
"""

from __future__ import annotations

import os
import shutil
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import loadgen  # noqa: E402
import run as bench_run  # noqa: E402
from common import Bench  # noqa: E402


def _bench(tmp_path: Path) -> Bench:
    b = Bench(quick=True, out_dir=tmp_path)
    b.add("enqueue", "bare psycopg x16 -> sftq.api_enqueue", 3000.0, "jobs/s")
    b.add("enqueue", "ratio HTTP (granian) / pgqueuer", 0.6, "x", goal=">= 1.0", ok=False)
    b.add("enqueue", "same, by CPU per job (noise-proof)", 0.7, "x", goal=">= 1.0", ok=False)
    b.add("enqueue", "HTTP (granian) p99", 12.0, "ms", goal="< 25", ok=True)
    b.add("enqueue", "  same, by CPU per job", 10.0, "%", goal="< 20", ok=True)
    b.add("analytics", "queue_context, typical user", 3.0, "ms", goal="< 5", ok=True)
    return b


def test_http_rows_are_not_judged_without_wrk(tmp_path: Path) -> None:
    b = _bench(tmp_path)
    bench_run.mark_not_comparable(b)
    table = bench_run.print_table(b)
    flags = {r.name: r.comparable for r in b.rows}
    assert not flags["ratio HTTP (granian) / pgqueuer"]
    assert not flags["same, by CPU per job (noise-proof)"]
    assert not flags["HTTP (granian) p99"]
    # Direct figures keep their verdict.
    assert flags["  same, by CPU per job"] and flags["queue_context, typical user"]
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    assert all(" n/c " in line for line in table.splitlines() if "HTTP" in line)
    assert "MISSED" not in table, lines
    assert b.notes[0].startswith("HTTP ratios are not comparable")


def test_a_run_without_wrk_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SFTQ_", "DATABASE_URL", "PYTHONPATH"))}
    env["SFTQ_BENCH_LOADGEN"] = "python"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", "enqueue",
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("note: HTTP ratios are not comparable") or \
        "\nnote: HTTP ratios are not comparable" in out
    table = out[out.index("section "):]
    http_rows = [line for line in table.splitlines() if "HTTP" in line and ">=" in line]
    assert http_rows and all(" n/c " in line for line in http_rows), http_rows


def test_ci_installs_wrk() -> None:
    """.ci/run and `make bench` install wrk; on CI it is on PATH."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert any("apt-get install" in line and " wrk" in line for line in ci.splitlines())
    make = (ROOT / "Makefile").read_text()
    bench = make[make.index("\nbench:"):]
    assert "apt-get install" in bench.split("\n\n")[0] and " wrk" in bench.split("\n\n")[0]
    if os.environ.get("CI"):
        assert shutil.which("wrk"), "wrk is not on PATH although .ci/run installs it"


class _OneAtATime(socketserver.TCPServer):
    """Like a gunicorn sync worker: one connection at a time, closed after its response."""

    allow_reuse_address = True


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        self.connection.settimeout(30)
        length = 0
        for line in iter(self.rfile.readline, b""):
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        else:
            return  # a connection closed without a request
        self.rfile.read(length)
        self.wfile.write(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n"
                         b"Connection: close\r\n\r\n{}")


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_one_wrk_thread_leaves_no_silent_connection_in_a_sync_worker_s_way() -> None:
    # The profile's set-up: 2 connections against a server that serves one connection at a
    # time (a gunicorn sync worker). With two wrk threads, the one done first left a silent
    # connection that the server sat on until the run's timeout, in 2 runs of 3 here.
    with _OneAtATime(("127.0.0.1", 0), _Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            start = time.monotonic()
            res = loadgen.wrk_load(f"http://127.0.0.1:{server.server_address[1]}", "/jobs",
                                   ["k1", "k2"], "{}", requests=400, connections=2, timeout_s=20)
            took = time.monotonic() - start
        finally:
            server.shutdown()
    assert res["requests"] >= 400 and res["errors"] == 0, res
    assert took < 10, f"the run took {took:.1f} s: a worker waited on a silent connection"
