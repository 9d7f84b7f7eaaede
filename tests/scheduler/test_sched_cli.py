"""`sftq tick`, `sftq ticker` and `sftq simulator` as real processes on loopback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import httpx
import psycopg
import pytest
from sched_support import (
    API_KEY,
    TICK_CHILD,
    TICK_SECRET,
    child_env,
    create_user,
    enqueue,
    state,
)

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.dev.pgcluster import free_port
from sftq_server.scheduler.http import make_tick_app
from sftq_server.simulator import SimulatorServer

Conn = psycopg.Connection[Any]


def server_cli(*args: str) -> list[str]:
    return [sys.executable, "-c", TICK_CHILD, *args]


def test_sftq_tick_prints_the_tick(conn: Conn, db_url: str, sim_server: SimulatorServer) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    # Through the installed `sftq` entry point, as a person would run it.
    done = subprocess.run(
        [sys.executable, "-m", "sftq_client", "tick", "--database-url", db_url,
         "--simulator-url", sim_server.url], capture_output=True, text=True, timeout=60,
        env=child_env())
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "ok" and result["admitted"] == [str(job_id)]
    assert state(conn, job_id) == "PROGRESS"
    assert API_KEY not in done.stdout + done.stderr


def test_sftq_tick_reads_the_dev_stack_env_file(conn: Conn, db_url: str,
                                                sim_server: SimulatorServer,
                                                tmp_path: Any) -> None:
    # After `sftq dev`, a bare `sftq tick` finds the database and the simulator in its env file.
    (tmp_path / "env").write_text(f"DATABASE_URL={db_url}\nSIMULATOR_URL={sim_server.url}\n")
    job_id = enqueue(conn, create_user(conn, "alice"))
    env = child_env()
    del env["FIREWORKS_API_KEY"]
    done = subprocess.run(server_cli("tick", "--data-dir", str(tmp_path)),
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["admitted"] == [str(job_id)]


def test_sftq_tick_without_a_provider(db_url: str, tmp_path: Any) -> None:
    env = child_env()
    del env["FIREWORKS_API_KEY"]
    done = subprocess.run(server_cli("tick", "--database-url", db_url,
                                     "--data-dir", str(tmp_path)),
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert "FIREWORKS_API_KEY" in done.stderr


def test_sftq_tick_database_unreachable(sim_server: SimulatorServer) -> None:
    done = subprocess.run(
        server_cli("tick", "--database-url", f"postgresql://postgres@127.0.0.1:{free_port()}/x",
                   "--simulator-url", sim_server.url),
        capture_output=True, text=True, timeout=60,
        env=child_env(SFTQ_DB_TIMEOUT_SECONDS="1"))
    assert done.returncode == 3, done.stderr
    assert "not reachable" in done.stderr


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def tick_server(settings: Settings, database: Database,
                make_provider: Any) -> Iterator[tuple[str, list[str]]]:
    """The tick app on a loopback port; yields its base URL and the paths it was asked for."""
    tick_app = make_tick_app(settings, db=database, provider_factory=make_provider)
    paths: list[str] = []

    def app(environ: Any, start_response: Any) -> Any:
        paths.append(environ["PATH_INFO"])
        return tick_app(environ, start_response)

    server = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", paths
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
        tick_app.close()


def test_ticker_posts_with_the_secret(conn: Conn, tick_server: tuple[str, list[str]]) -> None:
    base, paths = tick_server
    job_id = enqueue(conn, create_user(conn, "alice"))
    done = subprocess.run(server_cli("ticker", "--interval", "0.1", "--max-ticks", "3"),
                          capture_output=True, text=True, timeout=60,
                          env=child_env(SUPABASE_URL=base, SFTQ_TICK_SECRET=TICK_SECRET))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].endswith(f"ticker: POST {base}/functions/v1/scheduler-tick every 0.1s")
    assert len(lines) == 4
    assert " ok: admitted 1," in lines[1] and " ok: admitted 0," in lines[2]
    assert paths == ["/functions/v1/scheduler-tick"] * 3
    assert state(conn, job_id) == "PROGRESS"
    assert TICK_SECRET not in done.stdout + done.stderr


def test_ticker_survives_errors(tick_server: tuple[str, list[str]]) -> None:
    base, _ = tick_server
    dead = f"http://127.0.0.1:{free_port()}/functions/v1/scheduler-tick"
    for url, expected in ((base, "HTTP 401: missing or wrong tick secret"),
                          (dead, "error: ConnectError")):
        done = subprocess.run(server_cli("ticker", "--url", url, "--interval", "0.05",
                                         "--max-ticks", "2", "--timeout", "5"),
                              capture_output=True, text=True, timeout=60,
                              env=child_env(SFTQ_TICK_SECRET="not-the-secret-at-all"))
        assert done.returncode == 0, done.stderr
        lines = done.stdout.strip().splitlines()[1:]
        assert len(lines) == 2 and all(expected in line for line in lines), lines


def test_ticker_direct_stops_on_sigterm(conn: Conn, db_url: str,
                                        sim_server: SimulatorServer) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    child = subprocess.Popen(
        server_cli("ticker", "--direct", "--interval", "30", "--database-url", db_url,
                   "--simulator-url", sim_server.url),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        assert child.stdout is not None
        assert "direct ticks every 30s" in child.stdout.readline()
        assert " ok: admitted 1," in child.stdout.readline()
        started = time.monotonic()
        child.send_signal(signal.SIGTERM)
        assert child.wait(10) == 0
        assert time.monotonic() - started < 5  # it did not sleep out the 30 s interval
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        out, err = child.communicate()
    assert state(conn, job_id) == "PROGRESS"
    assert API_KEY not in out + err


def test_sftq_simulator_serves_until_sigterm() -> None:
    port = free_port()
    child = subprocess.Popen(
        server_cli("simulator", "--port", str(port), "--job-seconds", "0", "--max-gpus", "24"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                quota = httpx.get(f"http://127.0.0.1:{port}/_sim/quota", timeout=1).json()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and child.poll() is None
                time.sleep(0.05)
        assert quota["maxValue"] == 24
        child.send_signal(signal.SIGTERM)
        assert child.wait(10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.communicate()
