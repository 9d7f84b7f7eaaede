"""The webhooks benchmark section still runs (bench/run.py --quick --only webhooks): every
figure is a number and every delivery arrived. Benchmarks are not tests; no figure is judged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_webhooks_quick_runs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SFTQ_", "DATABASE_URL", "PYTHONPATH"))}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", "webhooks",
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "latest.json").read_text())
    assert result["failed"] == []
    rows = [r for r in result["rows"] if r["section"] == "webhooks"]
    assert len(rows) == 6
    assert all(isinstance(r["value"], (int, float)) for r in rows)
    latency = result["data"]["webhooks"]["latency"]
    assert all(p["delivered"] == p["n"] for p in latency.values())
    assert result["data"]["webhooks"]["enqueue_cost"]["deliveries_written"] > 0
