"""Pre-flight: how soon a payload bound to fail at Fireworks is refused.

The gateway the image runs (granian RSGI) on one database, one user. On one keep-alive
connection: `POST /functions/v1/jobs-api/jobs` whose SFT payload hides a misspelt field
(`learningrate` for `learningRate`) among valid ones, answered 400 invalid_fireworks_payload
by the shape check before anything reaches the database but the key check. Goal: under 50 ms,
against the job's whole wait it used to cost.
"""

from __future__ import annotations

import time

import httpx
import psycopg
import servers
from common import Bench, percentile

SECTION = "preflight"
PAYLOAD = {"baseModel": "accounts/fireworks/models/qwen3-14b",
           "dataset": "accounts/demo/datasets/bench-preflight", "epochs": 2, "loraRank": 16,
           "maxContextLength": 8192, "learningrate": 1e-4}


def run(b: Bench) -> None:
    rounds = 100 if b.quick else 2000
    dbname = "bench_preflight"
    url = b.new_db(dbname)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT sftq.create_user('bench-preflight')")
        row = conn.execute("SELECT key FROM sftq.issue_key('bench-preflight')").fetchone()
        assert row is not None
        key = str(row[0])
    server = servers.start(servers.ServerSpec("gateway for preflight (image)", "image",
                                              workers=1), url, b.out_dir / "logs")
    times: list[float] = []
    try:
        jobs = f"http://127.0.0.1:{server.port}/functions/v1/jobs-api/jobs"
        body = {"kind": "SFT", "fireworks_payload": PAYLOAD}
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as api:
            for i in range(rounds + 20):
                t0 = time.perf_counter()
                resp = api.post(jobs, json=body)
                elapsed = (time.perf_counter() - t0) * 1000
                assert resp.status_code == 400, resp.text
                assert resp.json()["code"] == "invalid_fireworks_payload", resp.text
                if i >= 20:  # the first requests warm the pool and lazy imports
                    times.append(elapsed)
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM sftq.jobs").fetchone()
            assert row is not None and row[0] == 0, "a refused payload was enqueued"
    finally:
        server.stop()
        b.drop_db(dbname)
    p50, p95 = percentile(times, 50), percentile(times, 95)
    b.data[SECTION] = {"rounds": rounds, "p50_ms": p50, "p95_ms": p95}
    b.add(SECTION, "POST /jobs, hidden typo -> 400 invalid_fireworks_payload, p95", p95, "ms",
          goal="< 50", ok=p95 < 50, note=f"p50 {p50:.2f}; {rounds} requests, one connection")
