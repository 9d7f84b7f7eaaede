"""The benchmark harness still runs: `bench/run.py --quick` on the sections CI can afford.

Benchmarks are not tests: nothing here judges a figure against its goal. It checks that every
chosen section ran, produced its rows as numbers, and wrote its JSON, so `make bench` does not
rot between runs. The stream and visibility sections' quick forms add about 40 s (2 cores).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("enqueue", "enqueue_cost", "admission", "analytics", "tick", "stream",
            "visibility")

# Rows each of these sections must print (by a part of their names free of the quick sizes).
ROWS = {
    "enqueue_cost": (
        "admission bookkeeping cost on enqueue (16 users)",
        "enqueue with the per-user limiter / without (16 producers, one a call)",
        "enqueue with the per-user limiter / without (2 producers, 8 a call)",
    ),
    "analytics": (
        "queue analytics answer, typical user",
        "of which the rows (sftq.queue_view, no JSON)",
        "of which the forecast (sftq.forecast)",
    ),
    "stream": (
        "idle streams: database queries per second",
        "idle streams: server RSS",
        "idle streams: server CPU",
        "commit to frame at the client, p50",
        "commit to frame at the client, p99",
        "admissions: streams with every frame once",
        "end-of-tick queue frames, 1 watched user: DB time",
        "end-of-tick queue frames, 10 watched users: DB time",
        "end-of-tick queue frames, 100 watched users: DB time",
        "end-of-tick queue frames: 100 watched users / 1",
    ),
    "visibility": (
        "estimates for all",
        "queue analytics with reasons and estimates",
        "GET /jobs without limit, user with",
        "GET /jobs without limit: peak Python memory",
        "estimate error at enqueue, median",
        "estimate error at enqueue, p90",
        "baseline: fixed 1 h per job, median error",
        "baseline: fixed 1 h per job, p90 error",
    ),
}


def test_bench_quick_runs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SFTQ_", "DATABASE_URL", "PYTHONPATH"))}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", ",".join(SECTIONS),
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "latest.json").read_text())
    assert result["failed"] == []
    ran = {row["section"] for row in result["rows"]}
    assert ran == set(SECTIONS), ran
    # The speed probe and the database probe before each section and after the last, in
    # milliseconds.
    for probe in ("speed_probe_ms", "db_probe_ms"):
        assert list(result[probe]) == [*SECTIONS, "end"], probe
        assert all(v > 0 for v in result[probe].values()), result[probe]
    assert "the database probe" in proc.stdout
    # The table is printed, and every figure is a number.
    assert "section" in proc.stdout and "figure" in proc.stdout
    assert all(isinstance(row["value"], (int, float)) for row in result["rows"])
    for section, names in ROWS.items():
        rows = [r for r in result["rows"] if r["section"] == section]
        for name in names:
            found = [r for r in rows if name in r["name"]]
            assert found, f"{section}: no row {name!r} in {[r['name'] for r in rows]}"
            assert all(math.isfinite(r["value"]) for r in found), found
    # The tick reconciles with one listing per kind, not one call per job.
    calls = [r for r in result["rows"] if r["name"].startswith("provider calls per steady tick")]
    assert calls and all(r["ok"] for r in calls)
