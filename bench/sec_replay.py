"""`sftq simulate` (issue 55): how fast a trace replays through the real admission and tick
on a virtual clock, and what one virtual tick costs as the queue grows.

Replay speed: a synthetic 7-day, 5,000-job trace from 30 users (3 heavy) with the deployed
settings (30 s tick, event admission on), in virtual seconds per wall second (goal: more
than 10,000x, i.e. the week in under 60 s). Tick cost: every job of a trace submitted at
once, then periodic ticks timed, at 100, 1,000 and 10,000 queued.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Any

from common import Bench

SECTION = "replay"


@dataclass(frozen=True)
class _Job:
    id: str
    submit_at: float
    user: str
    kind: str
    gpu_count: int
    run_seconds: float
    outcome: str = "SUCCESS"
    outcome_at: float | None = None
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Trace:
    jobs: tuple[_Job, ...]
    external: tuple[Any, ...] = ()


def synthetic(seed: int, days: float, jobs: int, users: int = 30) -> Any:
    """h10's generator when it is there; else Poisson arrivals, log-normal runs."""
    try:
        from sftq_server.simulate.generate import generate
    except ImportError:
        pass
    else:
        return generate(seed=seed, days=days, jobs=jobs, users=users, heavy_users=3)
    rng = random.Random(seed)
    times = sorted(rng.uniform(0, days * 86400) for _ in range(jobs))
    names = [f"user{i:02d}" for i in range(users)]
    weights = [8.0 if i < 3 else 1.0 for i in range(users)]
    return _Trace(tuple(
        _Job(f"j{i}", round(t, 1), rng.choices(names, weights)[0],
             rng.choice(("SFT", "DPO", "RFT")), rng.choice((1, 2, 4, 8)),
             round(min(8 * 3600, rng.lognormvariate(math.log(1500), 0.9)), 1))
        for i, t in enumerate(times)))


def run(b: Bench) -> None:
    from sftq_server.simulate.engine import Options, replay, tick_cost

    days, jobs = (0.25, 150) if b.quick else (7.0, 5000)
    results: dict[str, Any] = {}
    b.data[SECTION] = results
    url = b.new_db("bench_replay")
    try:
        r = replay(synthetic(55, days, jobs), Options(cap=2, quota=96, tick_interval=30.0,
                                                      event_admission=True), database_url=url)
    finally:
        b.drop_db("bench_replay")
    results["replay"] = {k: r[k] for k in ("virtual_seconds", "wall_seconds", "speedup",
                                           "ticks", "passes", "violations")}
    speed = r["virtual_seconds"] / max(r["wall_seconds"], 1e-9)
    b.add(SECTION, f"replay of {days:g} days, {jobs:,} jobs (virtual s per wall s)", speed, "x",
          goal="> 10000", ok=speed > 10_000 and not r["violations"],
          note=f"{r['wall_seconds']:.1f} s wall, {r['ticks']} passes "
               f"({', '.join(f'{k} {v}' for k, v in sorted(r['passes'].items()))})")
    for queued in ((100, 1000) if b.quick else (100, 1000, 10_000)):
        name = f"bench_replay_q{queued}"
        url = b.new_db(name)
        try:
            trace = _Trace(tuple(_Job(f"q{i}", 0.0, f"user{i % 30:02d}", "SFT", 4, 86400.0)
                                 for i in range(queued)))
            # A quota with room for a few: each tick admits little, the queue stays long.
            ms = tick_cost(trace, Options(cap=1, quota=16, event_admission=False), url,
                           passes=3 if b.quick else 8)
        finally:
            b.drop_db(name)
        results[f"tick_ms_{queued}"] = ms
        b.add(SECTION, f"one virtual tick with {queued:,} queued", statistics.median(ms), "ms",
              note=f"median of {len(ms)}; max {max(ms):.1f}")
