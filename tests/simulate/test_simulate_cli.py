"""`sftq simulate` from the command line: the report, --json, --compare, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

TRACE = """id,submit_at,user,kind,gpu_count,run_seconds
a,0,alice,SFT,4,100
b,5,alice,SFT,4,100
c,10,bob,SFT,4,50
"""


def sftq(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "functions"),
                                                       str(ROOT / "clients")])}
    return subprocess.run([sys.executable, "-m", "sftq_client", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    pytest.importorskip("sftq_server.simulate.trace", reason="the trace reader (h10) lands "
                        "with the same issue")
    path = tmp_path / "tiny.csv"
    path.write_text(TRACE)
    return path


def test_simulate_prints_the_report(trace: Path) -> None:
    done = sftq("simulate", str(trace), "--quota", "8", "--event-admission", "off")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "settings: cap 1, quota 8 GPUs, tick every 30 s, event admission off" in out
    assert "alice" in out and "bob" in out and "2.4 min" in out
    for label in ("Jain's fairness", "GPU utilisation", "idle GPU-hours", "blocked",
                  "jobs waiting over 3600 s", "replayed"):
        assert label in out


def test_simulate_json_and_compare(trace: Path) -> None:
    done = sftq("simulate", str(trace), "--event-admission", "off", "--json")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["users"]["alice"]["wait_max"] == 145.0 and result["violations"] == []
    both = sftq("simulate", str(trace), "--event-admission", "off", "--compare", "cap=1",
                "cap=2")
    assert both.returncode == 0, both.stderr
    assert "[A] cap 1" in both.stdout and "[B] cap 2" in both.stdout


def test_simulate_refuses_a_bad_compare_side_clearly(trace: Path) -> None:
    done = sftq("simulate", str(trace), "--compare", "cap=1", "caps=2")
    assert done.returncode == 2
    assert "is not key=value with a key of cap" in done.stderr
    assert "Traceback" not in done.stderr


def test_generate_then_replay_and_plot(tmp_path: Path) -> None:
    """--generate writes a trace the replay reads; --plot draws its figure (the waits per
    user come from the result's users[*].waits)."""
    pytest.importorskip("matplotlib")
    trace = tmp_path / "gen.csv"
    made = sftq("simulate", "--generate", str(trace), "--days", "0.1", "--jobs", "12",
                "--users", "3", "--heavy-users", "1", "--seed", "5")
    assert made.returncode == 0, made.stderr
    assert trace.read_text().startswith("# sftq simulate --generate")
    figure = tmp_path / "waits.svg"
    done = sftq("simulate", str(trace), "--quota", "16", "--json", "--plot", str(figure))
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert all(len(u["waits"]) == u["ran"] for u in result["users"].values())
    assert figure.read_text().lstrip().startswith(("<?xml", "<svg"))
