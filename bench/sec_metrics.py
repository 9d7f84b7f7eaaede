"""GET /metrics at 10^6 jobs: the one call behind a scrape, sftq.metrics() (issue 45's goal:
under 5 ms), read from the counts the triggers keep, never from a scan of jobs.

The data set is analytics' (bench/dataset.py): 600,000 finished jobs, 10 running, 400,000
QUEUED. Loaded by hand, the finished jobs never went through a transition, so
sftq.metrics_rebuild counts them once (what the migration does for an existing database).
Two figures: right after a tick folded the counts (one row per series), and with a busy tick
interval's worth of changes still unfolded (each enqueue statement, admission and end appends
one row until the next tick folds them).
"""

from __future__ import annotations

import json
from typing import Any

import dataset
import psycopg
from common import Bench, query, summarize, time_calls

SECTION = "metrics"
METRICS_SQL = "SELECT sftq.metrics()::text"
# A busy interval between two ticks: this many changes appended, none folded yet.
UNFOLDED = 5_000


def run(b: Bench) -> None:
    if b.quick:
        history, queued = 6_000, 4_000
    else:
        history, queued = 600_000, 400_000
    results: dict[str, Any] = {"jobs": history + queued + 10}
    b.data[SECTION] = results
    dbname = "bench_metrics"
    url = b.new_db(dbname)
    reps = 50 if b.quick else 200
    try:
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
            results["load_s"] = dataset.load(conn, queued=queued, running=10, history=history)
            conn.execute("SELECT sftq.metrics_rebuild()")
            # A few ticks' records, so the answer carries a quota, tick durations and calls.
            for _ in range(3):
                tick = conn.execute("SELECT sftq.tick_begin('bench', interval '2 minutes')"
                                    ).fetchone()
                assert tick is not None
                conn.execute("SELECT sftq.tick_finish(%s, %s::jsonb)", (tick[0], json.dumps({
                    "quota_limit": 64, "quota_usage": 40,
                    "quota": {"value": 64, "max_value": 96, "usage": 40},
                    "ours_total": 40, "ours_recent": 0,
                    "provider_requests": [{"call": c, "status": "200", "count": 3}
                                          for c in ("get_quota", "list_jobs", "create_job")]})))
            conn.execute("VACUUM ANALYZE sftq.metric_counts")
            answer = json.loads(conn.execute(METRICS_SQL).fetchone()[0])  # type: ignore[index]
            pending = sum(c["value"] for c in answer["counts"] if c["name"] == "pending_jobs")
            if pending != queued:
                raise RuntimeError(f"sftq.metrics counts {pending} pending jobs, not {queued}")
            results["series_rows"] = conn.execute(
                "SELECT count(*) FROM sftq.metric_counts").fetchone()[0]  # type: ignore[index]
            results["folded"] = summarize(time_calls(query(conn, METRICS_SQL), reps=reps))
            conn.execute("""
                INSERT INTO sftq.metric_counts (name, labels, value)
                SELECT (ARRAY['pending_jobs', 'running_jobs', 'admitted_jobs_total'])[1 + i %% 3],
                       CASE WHEN i %% 3 = 2 THEN '{}'::jsonb
                            ELSE jsonb_build_object('kind', 'SFT') END,
                       CASE WHEN i %% 3 = 0 THEN -1 ELSE 1 END
                  FROM generate_series(1, %s) i""", (UNFOLDED,))
            results["unfolded"] = summarize(time_calls(query(conn, METRICS_SQL), reps=reps))
    finally:
        b.drop_db(dbname)

    jobs = results["jobs"]
    f, u = results["folded"], results["unfolded"]
    b.add(SECTION, f"sftq.metrics() at {jobs:,} jobs, counts folded", f["p50"], "ms",
          goal="< 5", ok=f["p50"] < 5,
          note=f"{results['series_rows']} count rows; p95 {f['p95']:.2f}")
    b.add(SECTION, f"sftq.metrics() at {jobs:,} jobs, {UNFOLDED:,} changes unfolded", u["p50"],
          "ms", goal="< 5", ok=u["p50"] < 5,
          note=f"a busy tick interval before the fold; p95 {u['p95']:.2f}")
