"""`sftq dev` delivers webhooks on its own, with the ticker off (--tick-interval 0): a job
submitted over HTTP reaches a loopback receiver as a verified job.queued delivery, and
stopping the stack stops the deliverer too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from wh_support import Receiver, verify

from sftq_server.dev.pgcluster import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def descendants(root: int) -> set[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(
                int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_sftq_dev_delivers_without_the_ticker(db_url: str, tmp_path: Path,
                                              make_receiver: Callable[..., Receiver]) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SFTQ_", "SUPABASE_", "FIREWORKS_", "SIMULATOR_"))}
    env |= {"DATABASE_URL": db_url, "PYTHONUNBUFFERED": "1",
            # (the suite's placeholder payloads: tests/conftest.py)
            "SFTQ_PREFLIGHT": os.environ.get("SFTQ_PREFLIGHT", "on"),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "functions"), str(ROOT / "clients")])}
    port, sim_port = free_port(), free_port()
    log = tmp_path / "dev.log"
    with open(log, "wb") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sftq_client", "dev", "--data-dir", str(tmp_path / "dev"),
             "--port", str(port), "--simulator-port", str(sim_port), "--tick-interval", "0"],
            env=env, stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True)
        seen: set[int] = set()
        try:
            assert proc.stdout is not None
            values: dict[str, str] = {}
            deadline = time.monotonic() + 120
            for line in proc.stdout:
                if line.strip() == "ready":
                    break
                if "=" in line:
                    name, _, value = line.strip().partition("=")
                    values[name] = value.strip("'")
                assert time.monotonic() < deadline, log.read_text()
            else:
                raise AssertionError(f"sftq dev exited before ready:\n{log.read_text()}")
            seen |= descendants(proc.pid)
            assert any(" deliver" in cmdline(p) for p in seen), log.read_text()
            assert not any(" ticker" in cmdline(p) for p in seen)

            base = f"{values['SUPABASE_URL']}/functions/v1/jobs-api"
            auth = {"Authorization": f"Bearer {values['SFTQ_API_KEY']}"}
            receiver = make_receiver()
            with httpx.Client(base_url=base, headers=auth, timeout=10) as http:
                created = http.post("/webhooks", json={"url": receiver.url, "events": ["job.*"]})
                assert created.status_code == 201, created.text
                started = time.time()
                job = http.post("/jobs", json={"kind": "SFT", "fireworks_payload": {"a": 1}})
                assert job.status_code == 201, job.text
                (got,) = receiver.wait_for(1, timeout=10)
            payload = verify(created.json()["secret"], got)
            assert payload["type"] == "job.queued" and payload["data"]["id"] == job.json()["id"]
            # Not a figure (that is bench/sec_webhooks.py), just a sanity bound.
            assert got.at - started < 5.0
            seen |= descendants(proc.pid)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
            try:
                code = proc.wait(60)
                time.sleep(0.5)
                survivors = [p for p in seen if alive(p) and "postgres" not in cmdline(p)]
            finally:
                for pid in seen:
                    if alive(pid) and "postgres" not in cmdline(pid):
                        os.kill(pid, signal.SIGKILL)
                if proc.stdout is not None:
                    proc.stdout.close()
    assert code == 0, log.read_text()
    assert survivors == [], [cmdline(p) for p in survivors]
    assert "stopped" in log.read_text() and "webhooks" in log.read_text()
