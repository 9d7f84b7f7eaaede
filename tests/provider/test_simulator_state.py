"""The simulator's state file: a restarted simulator is the same account (issue 54, item 1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from conftest import FakeClock

from sftq_server.simulator import Simulator, SimulatorServer, StateFileError

BASE = "/v1/accounts/sim-account"
SFT = {"dataset": "accounts/a/datasets/d", "baseModel": "accounts/fireworks/models/m"}


@contextmanager
def running(sim: Simulator) -> Iterator[httpx.Client]:
    with SimulatorServer(sim) as server, httpx.Client(
        base_url=server.url, headers={"Authorization": "Bearer k"}, timeout=5.0
    ) as http:
        yield http


def job(http: httpx.Client, collection: str, job_id: str) -> dict[str, object]:
    r = http.get(f"{BASE}/{collection}/{job_id}")
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def test_a_restart_keeps_every_job_where_it_was(tmp_path: Path) -> None:
    path = tmp_path / "simulator.json"
    clock = FakeClock()
    first = Simulator(job_seconds=60, clock=clock, state_file=path)
    with running(first) as http:
        params = {"supervisedFineTuningJobId": "runs"}
        assert http.post(f"{BASE}/supervisedFineTuningJobs", params=params, json=SFT).is_success
        for name in ("bad", "broken", "stopped"):
            r = http.post(f"{BASE}/dpoJobs", params={"dpoJobId": name}, json={"dataset": "d"})
            assert r.status_code == 200, r.text
        clock.advance(20)
        before = job(http, "supervisedFineTuningJobs", "runs")
        assert before["state"] == "JOB_STATE_RUNNING"
        assert http.post("/_sim/jobs/dpoJobs/bad:finish", json={
            "state": "JOB_STATE_FAILED", "message": "dataset has 3 rows",
            "code": "FAILED_PRECONDITION"}).status_code == 200
        assert http.post("/_sim/jobs/dpoJobs/broken:finish",
                         json={"state": "JOB_STATE_FAILED"}).status_code == 200
        assert http.delete(f"{BASE}/dpoJobs/stopped").status_code == 200
        http.post("/_sim/quota", json={"maxValue": 24, "external_usage": 3})
        http.post("/_sim/resources", json={"resources": {"accounts/a/datasets/gone": None}})
        http.post("/_sim/rate_limit", json={"rpm": 500})
        http.post("/_sim/faults", json={"rules": [
            {"method": "GET", "path": "/quotas", "status": 503, "times": 2}]})
        bad_before = job(http, "dpoJobs", "bad")
    assert json.loads(path.read_text())["version"] == 1

    # A new process: its own monotonic clock, which starts anywhere.
    clock2 = FakeClock(start=5.0)
    second = Simulator(job_seconds=60, clock=clock2, state_file=path)
    with running(second) as http:
        after = job(http, "supervisedFineTuningJobs", "runs")
        assert after["state"] == "JOB_STATE_RUNNING"
        assert after["createTime"] == before["createTime"]
        assert after["jobProgress"] == before["jobProgress"]
        bad = job(http, "dpoJobs", "bad")
        assert bad["status"] == {"code": "FAILED_PRECONDITION", "message": "dataset has 3 rows"}
        assert bad["completedTime"] == bad_before["completedTime"]
        assert job(http, "dpoJobs", "broken")["status"] == {"code": "INTERNAL", "message": ""}
        assert http.get(f"{BASE}/dpoJobs/stopped").status_code == 404
        settings = http.get("/_sim/quota").json()
        assert (settings["maxValue"], settings["external_usage"]) == (24, 3)
        assert settings["true_usage"] == 4 + 3  # the running SFT job and the external usage
        assert http.get("/_sim/resources").json()["resources"] == {
            "accounts/a/datasets/gone": None}
        assert http.get("/_sim/rate_limit").json()["rpm"] == 500
        assert http.get(f"{BASE}/quotas").status_code == 503
        assert http.get(f"{BASE}/quotas").status_code == 503
        assert http.get(f"{BASE}/quotas").status_code == 200
        # The run's time passes (as it does while a stack is down): it has finished.
        clock2.advance(45)
        done = job(http, "supervisedFineTuningJobs", "runs")
        assert done["state"] == "JOB_STATE_COMPLETED"
        assert done["jobProgress"] == {"percent": 100, "epoch": 1}


def test_time_that_passed_while_it_was_down_counts(tmp_path: Path) -> None:
    path = tmp_path / "simulator.json"
    first = Simulator(job_seconds=60, clock=FakeClock(), state_file=path)
    with running(first) as http:
        r = http.post(f"{BASE}/dpoJobs", params={"dpoJobId": "j"}, json={"dataset": "d"})
        assert r.status_code == 200
    # Down for two minutes of wall-clock time: as if the job was created that long ago.
    saved = json.loads(path.read_text())
    saved["jobs"][0]["created"] -= 120
    path.write_text(json.dumps(saved))
    with running(Simulator(job_seconds=60, clock=FakeClock(), state_file=path)) as http:
        assert job(http, "dpoJobs", "j")["state"] == "JOB_STATE_COMPLETED"


def test_reads_never_write_and_changes_replace_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "simulator.json"
    sim = Simulator(clock=FakeClock(), state_file=path)
    with running(sim) as http:
        assert not path.exists()  # nothing changed yet
        http.post(f"{BASE}/dpoJobs", params={"dpoJobId": "j"}, json={"dataset": "d"})
        stamp = path.stat().st_mtime_ns, path.stat().st_ino
        for _ in range(5):
            job(http, "dpoJobs", "j")
            http.get(f"{BASE}/dpoJobs")
            http.get("/_sim/jobs")
        assert (path.stat().st_mtime_ns, path.stat().st_ino) == stamp
        http.post(f"{BASE}/dpoJobs/j:cancel")
        # os.replace: a new file, never one written over in place.
        assert path.stat().st_ino != stamp[1]
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert not list(tmp_path.glob("*.tmp"))
        http.post("/_sim/reset")
    assert json.loads(path.read_text())["jobs"] == []


def test_without_a_state_file_it_stays_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    monkeypatch.chdir(tmp_path)
    with running(Simulator(clock=FakeClock())) as http:
        http.post(f"{BASE}/dpoJobs", params={"dpoJobId": "j"}, json={"dataset": "d"})
    assert list(tmp_path.iterdir()) == []


def test_an_unreadable_state_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "simulator.json"
    path.write_text("{not json")
    with pytest.raises(StateFileError, match="simulator.json is not valid JSON.*remove it"):
        Simulator(state_file=path)
    path.write_text('{"version": 99}')
    with pytest.raises(StateFileError, match="not a version 1 state"):
        Simulator(state_file=path)
    path.write_text('{"version": 1, "jobs": [{"collection": "dpoJobs"}]}')
    with pytest.raises(StateFileError, match="could not be read back.*remove it"):
        Simulator(state_file=path)


def test_a_scripted_rule_spent_before_the_restart_stays_spent(tmp_path: Path) -> None:
    path = tmp_path / "simulator.json"
    with running(Simulator(clock=FakeClock(), state_file=path)) as http:
        http.post("/_sim/faults", json={"rules": [
            {"method": "GET", "path": "/quotas", "status": 503, "times": 1}]})
        assert http.get(f"{BASE}/quotas").status_code == 503
    with running(Simulator(clock=FakeClock(), state_file=path)) as http:
        assert http.get(f"{BASE}/quotas").status_code == 200


def _sftq_simulator(*args: str) -> subprocess.Popen[str]:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root / "functions"), str(root / "clients")])}
    return subprocess.Popen(
        [sys.executable, "-m", "sftq_client", "simulator", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)


def test_sftq_simulator_takes_a_state_file(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    for run in (1, 2):
        proc = _sftq_simulator("--state-file", str(path))
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip().rsplit(" ", 1)[-1]
            with httpx.Client(base_url=url, headers={"Authorization": "Bearer k"},
                              timeout=5.0) as http:
                if run == 1:
                    r = http.post(f"{BASE}/dpoJobs", params={"dpoJobId": "kept"},
                                  json={"dataset": "d"})
                    assert r.status_code == 200, r.text
                else:
                    assert job(http, "dpoJobs", "kept")["state"] != "JOB_STATE_CANCELLED"
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=10)
            assert proc.returncode == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    path.write_text("{broken")
    proc = _sftq_simulator("--state-file", str(path))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "sim.json is not valid JSON" in err, err
