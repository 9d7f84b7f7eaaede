"""Start and stop the HTTP servers the enqueue section measures, each in its own process
group on loopback; every start is paired with `stop()` in a finally."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import BENCH, FUNCTIONS, ROOT, children, stop_process, tree, vm_hwm_kib

from sftq_server.dev.pgcluster import free_port

VENV_BIN = Path(sys.executable).parent


@dataclass
class ServerSpec:
    """One way of serving the jobs-api."""

    name: str
    # gunicorn | granian (WSGI, bench/wsgi_jobs.py) | ff | image: the Dockerfile's command,
    # granian RSGI serving the whole gateway (sftq_server.http.gateway_rsgi) at the contract's paths
    kind: str
    workers: int = 1
    threads: int = 1
    worker_class: str = "sync"
    access_log: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    profile_out: str | None = None

    @property
    def prefix(self) -> str:
        return "/functions/v1/jobs-api" if self.kind == "image" else ""

    @property
    def path(self) -> str:
        return self.prefix + "/jobs"


@dataclass
class Server:
    spec: ServerSpec
    proc: subprocess.Popen[Any]
    port: int
    log_path: Path

    def pids(self) -> list[int]:
        return tree(self.proc.pid) if self.proc.poll() is None else []

    def worker_pids(self) -> list[int]:
        kids = children(self.proc.pid)
        return kids or [self.proc.pid]

    def peak_rss_kib(self) -> int:
        return max((vm_hwm_kib(p) for p in self.worker_pids()), default=0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            # The whole group: gunicorn's master forwards SIGTERM to its workers, granian too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            stop_process(self.proc)


def _tool(name: str) -> str:
    path = VENV_BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(name)
    return found


def available(kind: str) -> bool:
    try:
        _tool({"gunicorn": "gunicorn", "granian": "granian", "image": "granian",
               "ff": "functions-framework"}[kind])
    except FileNotFoundError:
        return False
    return True


def start(spec: ServerSpec, database_url: str, log_dir: Path) -> Server:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SFTQ_", "DATABASE_URL"))}
    env.update({
        "DATABASE_URL": database_url,
        "SFTQ_DB_POOL_MAX": str(max(1, spec.threads)),
        "PYTHONPATH": os.pathsep.join([str(BENCH / "site"), str(FUNCTIONS), str(BENCH)]),
        "SFTQ_BENCH_ACCESS_LOG": "1" if spec.access_log else "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    env.update(spec.extra_env)
    if spec.kind == "gunicorn":
        cmd = [_tool("gunicorn"), "--bind", f"127.0.0.1:{port}", "--workers", str(spec.workers),
               "--worker-class", spec.worker_class, "--threads", str(spec.threads),
               "--backlog", "2048", "--keep-alive", "5", "--log-level", "warning",
               "--chdir", str(ROOT)]
        if spec.profile_out:
            env["SFTQ_BENCH_PROFILE_OUT"] = spec.profile_out
            cmd += ["--config", str(BENCH / "gunicorn_profile.py")]
        cmd += ["wsgi_jobs:app"]
    elif spec.kind == "granian":
        cmd = [_tool("granian"), "--interface", "wsgi", "--host", "127.0.0.1",
               "--port", str(port), "--workers", str(spec.workers),
               "--blocking-threads", str(spec.threads), "--log-level", "warning",
               "--no-ws", "--working-dir", str(BENCH), "wsgi_jobs:app"]
    elif spec.kind == "image":
        # What the image runs (Dockerfile CMD), with its defaults (pool, threads), its own
        # logging set-up and a tick secret, which it checks at start.
        del env["SFTQ_DB_POOL_MAX"]
        env["SFTQ_TICK_SECRET"] = "bench-tick-secret-0123456789abcdef-0123"
        cmd = [_tool("granian"), "--interface", "rsgi", "--host", "127.0.0.1",
               "--port", str(port), "--workers", str(spec.workers), "--log-level", "warning",
               "--no-ws", "--factory", "sftq_server.http.gateway_rsgi:create_app"]
    elif spec.kind == "ff":
        # functions-framework runs gunicorn itself: WORKERS processes of THREADS threads
        # (its defaults: 1 worker, 4 threads per CPU).
        env["WORKERS"] = str(spec.workers)
        env["THREADS"] = str(spec.threads)
        cmd = [_tool("functions-framework"), "--source", str(FUNCTIONS / "jobs_api.py"),
               "--target", "jobs_api", "--host", "127.0.0.1", "--port", str(port)]
    else:
        raise ValueError(spec.kind)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{spec.name.replace(' ', '_').replace('/', '-')}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    server = Server(spec, proc, port, log_path)
    try:
        _wait_ready(server)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_ready(server: Server, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            break
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            conn.request("GET", server.spec.prefix + "/health")
            resp = conn.getresponse()
            resp.read()
            conn.close()
            if resp.status == 200:
                # Every worker up (gunicorn forks them after the master binds).
                time.sleep(0.5)
                return
            last = f"HTTP {resp.status}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    tail = server.log_path.read_text(errors="replace")[-2000:] if server.log_path.exists() else ""
    raise RuntimeError(f"{server.spec.name} did not become ready ({last}); log tail:\n{tail}")
