"""The run says when the machine's own speed changed under it, which steal time does not show.

Two probes are taken before every section and after the last: the speed probe (a fixed CPU
loop) and the database probe (a fixed hash aggregation in the bench's PostgreSQL, whose data
outgrows a core's own caches). A spread of more than 25% between a probe's fastest and slowest
takes a note naming the slow sections and the probe. tests/bench/test_bench_smoke.py checks
that a run records both.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import run as bench_run  # noqa: E402
from common import speed_probe  # noqa: E402


def test_a_steady_machine_takes_no_note() -> None:
    assert bench_run.probe_note({"enqueue": 40.0, "analytics": 44.0, "end": 41.0}) is None
    assert bench_run.probe_note({"enqueue": 40.0}) is None


def test_a_slowed_machine_is_named_by_section() -> None:
    note = bench_run.probe_note({"enqueue": 40.0, "analytics": 100.0, "tick": 42.0,
                                 "end": 90.0})
    assert note is not None
    assert "40-100 ms (2.5x; slow before: analytics, end)" in note


def test_the_note_says_which_probe_slowed() -> None:
    steady_cpu = {"enqueue": 31.0, "analytics": 33.0, "end": 32.0}
    slow_db = {"enqueue": 120.0, "analytics": 230.0, "end": 125.0}
    assert bench_run.probe_note(steady_cpu, bench_run.CPU_PROBE) is None
    note = bench_run.probe_note(slow_db, bench_run.DB_PROBE)
    assert note is not None
    assert note.startswith("the machine's speed changed during the run: a fixed hash "
                           "aggregation in PostgreSQL (the database probe) took 120-230 ms "
                           "(1.9x; slow before: analytics)")


def test_the_probe_times_real_work() -> None:
    ms = speed_probe(rounds=2)
    assert 1.0 < ms < 5000.0
