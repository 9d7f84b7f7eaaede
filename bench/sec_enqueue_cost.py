"""What the queue's own bookkeeping costs enqueue, measured in paired rounds: the admission
bookkeeping (the owners' counters and heads, the two partial indexes on QUEUED jobs), and the
per-user request limiter (issue 52), each against the same statement without it, in the same
run on the same database. A section of its own so that it can be run alone
(`bench/run.py --only enqueue_cost`); the paths it measures are sec_enqueue's.
"""

from __future__ import annotations

import statistics
from typing import Any

from common import Bench
from sec_enqueue import run_admission_cost, run_limiter_cost

SECTION = "enqueue_cost"


def run(b: Bench) -> None:
    n = 600 if b.quick else 15_000
    results: dict[str, Any] = {}
    b.data["enqueue_cost"] = results
    cost = run_admission_cost(b, n if not b.quick else 400, rounds=1 if b.quick else 5)
    results["admission_cost"] = cost
    for users, figs in cost.items():
        prod, noadm = figs["production"]["rps"], figs["no_admission"]["rps"]
        overhead = statistics.median(figs["overheads"])
        main = users == "16 users"
        b.add(SECTION, f"admission bookkeeping cost on enqueue ({users})", overhead * 100, "%",
              goal="< 20" if main else "", ok=(overhead < 0.20) if main else None,
              note=f"median of {len(figs['overheads'])} paired rounds: "
                   + ", ".join(f"{x * 100:.1f}" for x in figs["overheads"])
                   + f" %; best {prod:,.0f} vs {noadm:,.0f} jobs/s without it")
        c_prod = figs["production"]["cpu_ms_per_job"]
        c_noadm = figs["no_admission"]["cpu_ms_per_job"]
        by_cpu = statistics.median(figs["cpu_overheads"])
        b.add(SECTION, "  same, by CPU per job", by_cpu * 100, "%", goal="< 20" if main else "",
              ok=(by_cpu < 0.20) if main else None,
              note="rounds " + ", ".join(f"{x * 100:.1f}" for x in figs["cpu_overheads"])
                   + f" %; best {c_prod:.3f} vs {c_noadm:.3f} ms of machine CPU per job")

    limiter = run_limiter_cost(b, n if not b.quick else 400, rounds=1 if b.quick else 5)
    results["limiter_cost"] = limiter
    for shape, figs in limiter.items():
        ratio = statistics.median(figs["ratios"])
        b.add(SECTION, f"enqueue with the per-user limiter / without ({shape})", ratio, "x",
              goal=">= 0.95", ok=ratio >= 0.95,
              note=f"median of {len(figs['ratios'])} paired rounds: "
                   + ", ".join(f"{x:.3f}" for x in figs["ratios"])
                   + f"; by CPU per job {statistics.median(figs['cpu_ratios']):.3f}x; best "
                   f"{figs['on']:,.0f} vs {figs['off']:,.0f} jobs/s")
