"""A full scheduler tick against the in-process Fireworks simulator (real HTTP on loopback)
with 100 and 1,000 submitted jobs to reconcile: wall time and provider calls.

Setup per size: N users with one job each (kinds round robin), a quota of 4N + 64 GPUs, and a
first tick that admits and creates all N (measured too). Then three steady ticks that only
reconcile (listing each kind in pages of 200), and one tick after the provider finished 10% of
the jobs, which moves those to SUCCESS.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import psycopg
from common import Bench

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.provider import FireworksClient
from sftq_server.scheduler.tick import run_tick
from sftq_server.simulator import Simulator, SimulatorServer

SECTION = "tick"
ACCOUNT = "sim-account"
KINDS = ("SFT", "DPO", "RFT")
COLLECTION = {"SFT": "supervisedFineTuningJobs", "DPO": "dpoJobs",
              "RFT": "reinforcementFineTuningJobs"}

PAYLOADS = {
    "SFT": '{"dataset": "accounts/bench/datasets/d", "baseModel": "m"}',
    "DPO": '{"dataset": "accounts/bench/datasets/d", "trainingConfig": {"baseModel": "m"}}',
    "RFT": '{"dataset": "accounts/bench/datasets/d", "evaluator": "accounts/bench/evaluators/e",'
           ' "inferenceParameters": {"responseCandidatesCount": 4}}',
}


def expected_calls(n: int) -> int:
    """One listing per kind in pages of 200, plus the quota read."""
    per_kind = [len(range(i, n, len(KINDS))) for i in range(len(KINDS))]
    return sum(math.ceil(k / 200) for k in per_kind if k) + 1


def _one_size(b: Bench, n: int) -> dict[str, Any]:
    dbname = f"bench_tick_{n}"
    url = b.new_db(dbname)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO sftq.users (name) SELECT format('t%%s', i) "
                     "FROM generate_series(1, %s) i", (n,))
        ids = [int(r[0]) for r in conn.execute("SELECT id FROM sftq.users ORDER BY id")]
        for i, uid in enumerate(ids):
            kind = KINDS[i % len(KINDS)]
            conn.execute("SELECT sftq.enqueue(%s, %s, %s::jsonb, NULL, 4)",
                         (uid, kind, PAYLOADS[kind]))
    sim = Simulator(account_id=ACCOUNT, job_seconds=0, max_value=4 * n + 64, seed=1)
    out: dict[str, Any] = {"jobs": n, "expected_calls": expected_calls(n)}
    with SimulatorServer(sim) as server:
        provider = FireworksClient(base_url=server.url, api_key="bench-key", account_id=ACCOUNT,
                                   timeout=10.0)
        db = Database(url, max_size=4, timeout=10.0)
        settings = Settings(database_url=url, fireworks_base_url=server.url,
                            fireworks_api_key="bench-key", fireworks_account_id=ACCOUNT,
                            usage_grace_seconds=300.0, tick_lease_seconds=120.0)
        try:
            first = run_tick(db, provider, settings, holder="bench")
            out["first"] = {"ms": first["duration_ms"], "calls": first["provider_calls"],
                            "admitted": len(first["admitted"]), "submitted": first["submitted"],
                            "status": first["status"]}
            steady = [run_tick(db, provider, settings, holder="bench") for _ in range(3)]
            for t in steady:
                if t["status"] != "ok":
                    raise RuntimeError(f"steady tick: {t['errors'][:3]}")
            out["steady"] = {"ms": statistics.median(t["duration_ms"] for t in steady),
                             "calls": max(t["provider_calls"] for t in steady),
                             "runs_ms": [t["duration_ms"] for t in steady]}
            finished = 0
            for job in sim.jobs()[: max(1, n // 10)]:
                coll, jid = job["name"].split("/")[-2:]
                sim.finish(coll, jid, "JOB_STATE_COMPLETED")
                finished += 1
            t = run_tick(db, provider, settings, holder="bench")
            out["after_finish"] = {"ms": t["duration_ms"], "calls": t["provider_calls"],
                                   "reconciled": t["reconciled"], "finished_at_provider": finished}
        finally:
            db.close()
            provider.close()
    b.drop_db(dbname)
    return out


def run(b: Bench) -> None:
    sizes = [100] if b.quick else [100, 1000]
    results: dict[str, Any] = {}
    b.data[SECTION] = results
    for n in sizes:
        r = _one_size(b, n)
        results[str(n)] = r
        f, s, a = r["first"], r["steady"], r["after_finish"]
        b.add(SECTION, f"tick that admits + creates {n:,} jobs", f["ms"], "ms",
              note=f"{f['calls']} provider calls; admitted {f['admitted']}, "
                   f"submitted {f['submitted']}")
        b.add(SECTION, f"steady tick reconciling {n:,} running jobs", s["ms"], "ms",
              note=f"runs {s['runs_ms']} ms")
        b.add(SECTION, f"provider calls per steady tick, {n:,} jobs", s["calls"], "calls",
              goal=f"<= {r['expected_calls']}", ok=s["calls"] <= r["expected_calls"],
              note="one listing per kind in pages of 200 + the quota")
        b.add(SECTION, f"tick after 10% finished, {n:,} jobs", a["ms"], "ms",
              note=f"{a['calls']} provider calls; {a['reconciled']} reconciled to SUCCESS")
