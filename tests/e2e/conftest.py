"""End to end: `sftq dev` and `sftq admin` as real processes on loopback.

Each stack is a subprocess whose every descendant is tracked through /proc, so a test can
check that stopping it leaves nothing behind. Most tests point the stack at a fresh clone
of the session's migrated template (DATABASE_URL) to stay quick; the embedded-PostgreSQL
path is exercised on its own.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from sftq_server.dev.pgcluster import free_port  # the e2e tests import it from here

ROOT = Path(__file__).resolve().parents[2]
# Credentials or URLs from a developer's shell must not steer these tests.
SCRUBBED_ENV = (
    "DATABASE_URL",
    "SUPABASE_URL",
    "SIMULATOR_URL",
    "SFTQ_API_KEY",
    "SFTQ_API_URL",
    "SFTQ_TICK_SECRET",
    "FIREWORKS_API_KEY",
    "FIREWORKS_ACCOUNT_ID",
    "FIREWORKS_BASE_URL",
)
ENV_NAMES = ("SUPABASE_URL", "DATABASE_URL", "SIMULATOR_URL", "SFTQ_TICK_SECRET", "SFTQ_API_KEY",
             "DASHBOARD_URL")

SFT_PAYLOAD: dict[str, Any] = {
    "baseModel": "accounts/fireworks/models/qwen3-14b",
    "dataset": "accounts/demo/datasets/e2e-sft",
    "outputModel": "accounts/demo/models/e2e-sft-v1",
    "epochs": 1,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "functions"), str(ROOT / "clients"), env.get("PYTHONPATH")) if p
    )
    return env | extra


def sftq_argv(*args: str) -> list[str]:
    """The `sftq` console script's entry point, run by this interpreter."""
    return [sys.executable, "-m", "sftq_client", *args]


# -- processes ---------------------------------------------------------------------------
def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may itself hold spaces or parentheses.
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it has already stopped)."""
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat[1], []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "pg" / "pgdata" / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


class DevProcess:
    """One `sftq dev` subprocess: stdout read line by line, stderr kept in a log file."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        wrapper: tuple[str, ...] = (),
    ) -> None:
        self.args = args
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [*wrapper, *sftq_argv("dev", *args)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            # Its own process group, like a job in a terminal: ctrl_c() signals the group.
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.seen_pids: set[int] = set()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"sftq dev not ready after {timeout:g}s\n{self.log()}")
            try:
                line = self._queue.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                self.track()
                continue
            if line is None:
                self.proc.wait(timeout=30)
                raise AssertionError(
                    f"sftq dev exited with {self.proc.returncode} before ready; "
                    f"stdout={self.lines}\n{self.log()}"
                )
            self.lines.append(line)
            self.track()
            if line == "ready":
                return dict(ln.split("=", 1) for ln in self.lines if "=" in ln)

    def track(self) -> set[int]:
        """Remember every descendant seen so far, to check later that each one is gone."""
        self.seen_pids |= descendants(self.pid)
        return self.seen_pids

    def child_matching(self, needle: str) -> int:
        for pid in self.track():
            if needle in cmdline(pid) and alive(pid):
                return pid
        raise AssertionError(
            f"no live child matching {needle!r}: { {p: cmdline(p) for p in self.seen_pids} }"
        )

    def send(self, sig: signal.Signals) -> None:
        self.track()
        self.proc.send_signal(sig)

    def ctrl_c(self) -> None:
        """What a terminal does on Ctrl-C: SIGINT to every process in the foreground group."""
        self.track()
        os.killpg(self.pid, signal.SIGINT)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"sftq dev did not exit within {timeout:g}s\n{self.log()}"
            ) from exc
        self._reader.join(timeout=10)
        return code

    def close(self) -> None:
        """Last resort for a failed test: nothing may outlive it."""
        self.track()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.seen_pids:
            if alive(pid) and "postgres" not in cmdline(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._reader.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


class DevStacks:
    """Starts stacks for a test and makes sure each is gone (database included) afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[tuple[DevProcess, Path]] = []
        self._count = 0

    def start(
        self,
        data_dir: Path | None = None,
        *,
        database_url: str | None = None,
        tick_interval: float = 0,
        job_seconds: float = 0,
        port: int | None = None,
        simulator_port: int | None = None,
        cwd: Path | None = None,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        wrapper: tuple[str, ...] = (),
    ) -> DevProcess:
        """`sftq dev` on free ports; `wrapper` is an argv the command is appended to."""
        self._count += 1
        data_dir = data_dir or self.tmp_path / f"stack{self._count}"
        args = [
            "--data-dir",
            str(data_dir),
            "--port",
            str(port or free_port()),
            "--simulator-port",
            str(simulator_port or free_port()),
            "--tick-interval",
            f"{tick_interval:g}",
            "--simulator-job-seconds",
            f"{job_seconds:g}",
            *extra,
        ]
        full_env = clean_env(**(env or {}))
        if database_url:
            full_env["DATABASE_URL"] = database_url
        proc = DevProcess(
            args,
            full_env,
            cwd or self.tmp_path,
            self.tmp_path / f"dev{self._count}.stderr.log",
            wrapper,
        )
        self.started.append((proc, data_dir))
        return proc

    def close(self) -> None:
        for proc, data_dir in self.started:
            proc.close()
            stop_embedded(data_dir)


def stop_embedded(data_dir: Path) -> None:
    """Stop a stack's embedded PostgreSQL if it still runs; as root, also remove the folder
    outside the data dir that <data-dir>/pg links to."""
    pg = data_dir / "pg"
    if (pg / "pgdata").is_dir():
        from sftq_server.dev.pgcluster import LocalCluster

        cluster = LocalCluster(pg, port=1)
        try:
            if cluster.running():
                cluster.stop("immediate")
        finally:
            if pg.is_symlink():
                shutil.rmtree(pg.resolve(), ignore_errors=True)
                pg.unlink()
    elif pg.is_symlink():
        shutil.rmtree(pg.resolve(), ignore_errors=True)
        pg.unlink()


@pytest.fixture
def stacks(tmp_path: Path) -> Iterator[DevStacks]:
    s = DevStacks(tmp_path)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


def run_sftq(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sftq_argv(*args),
        env=env or clean_env(),
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
