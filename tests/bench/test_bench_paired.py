"""The goal's ratio against pgqueuer comes from paired rounds (bench/sec_enqueue.py): both
paths back to back, in alternating order, so that a machine whose speed drifts between runs
slows both sides of a round alike."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import sec_enqueue  # noqa: E402


def test_rounds_alternate_their_order_and_pair_each_paths_runs() -> None:
    calls: list[str] = []

    def path(name: str) -> Any:
        def run() -> dict[str, Any]:
            calls.append(name)
            # Quiet.run reads the CPU split to decide whether a run was disturbed.
            return {"name": name, "n": len(calls),
                    "cpu_ms_per_req": {"other": 0.0, "machine": 1.0}}
        return run

    pairs = sec_enqueue.paired_rounds(sec_enqueue.Quiet(), path("http"), path("pgq"), rounds=4)
    assert calls == ["http", "pgq", "pgq", "http", "http", "pgq", "pgq", "http"]
    assert [(a["name"], b["name"]) for a, b in pairs] == [("http", "pgq")] * 4
    # Each pair holds the two runs made back to back.
    assert [(a["n"], b["n"]) for a, b in pairs] == [(1, 2), (4, 3), (5, 6), (8, 7)]
