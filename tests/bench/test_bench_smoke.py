"""The benchmark harness still runs: `bench/run.py --quick` on the fast sections.

Benchmarks are not tests: nothing here judges a figure. It checks that every chosen section
ran, produced rows, and wrote its JSON, so `make bench` does not rot between runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("enqueue", "admission", "analytics", "tick")


def test_bench_quick_runs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SFTQ_", "DATABASE_URL", "PYTHONPATH"))}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", ",".join(SECTIONS),
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "latest.json").read_text())
    assert result["failed"] == []
    ran = {row["section"] for row in result["rows"]}
    assert ran == set(SECTIONS), ran
    # The table is printed, and every figure is a number.
    assert "section" in proc.stdout and "figure" in proc.stdout
    assert all(isinstance(row["value"], (int, float)) for row in result["rows"])
    # The tick reconciles with one listing per kind, not one call per job.
    calls = [r for r in result["rows"] if r["name"].startswith("provider calls per steady tick")]
    assert calls and all(r["ok"] for r in calls)
