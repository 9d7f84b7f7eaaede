"""Where a worker's time goes on POST /jobs: cProfile in one gunicorn sync worker under the
same wrk load, each function's own time put in a bucket, divided by the requests served.

cProfile measures wall time and slows Python code down (roughly 1.5-2x for code made of many
small calls), so the buckets are read as shares; the enqueue section's CPU-per-request figures
(from /proc, no profiler) are the absolute numbers. A sync worker is used because cProfile
sees only the thread that started it. The load is 2 connections from one wrk thread, so the
worker is busy all the time but never shares a core with a second request.
"""

from __future__ import annotations

import glob
import http.client
import pstats
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import loadgen
import servers
from common import Bench
from gunicorn_profile import START_QUERY
from sec_enqueue import BODY, fresh_db
from servers import ServerSpec

SECTION = "profile"
# One request at a time: the worker then never waits for a CPU inside a send() while another
# process runs, so its wall time splits cleanly into its own work and real waits.
CONNECTIONS = 2

# (bucket, test on "file:function") in order: the first match wins.
BUCKETS: list[tuple[str, re.Pattern[str]]] = [
    # psycopg's wait loop runs in C (psycopg_binary): its time shows as Connection.wait's own.
    ("waiting for PostgreSQL",
     re.compile(r"psycopg/connection\.py:wait$|wait_c|psycopg/waiting\.py")),
    ("waiting for the client (accept/recv/close)",
     re.compile(r"'(recv|recv_into|accept|_accept)'|select\.(select|poll|epoll)|selectors\.py"
                r"|close_graceful")),
    ("socket writes (kernel)", re.compile(r"'(send|sendall|shutdown|close)' of '_socket")),
    ("psycopg client + pool", re.compile(r"psycopg")),
    ("pydantic validation", re.compile(r"pydantic")),
    ("sftq_server.http.web (request, routing, response)", re.compile(r"sftq_server/web\.py")),
    ("sftq_server.http.routes.jobs + db (auth, checks, call)",
     re.compile(r"sftq_server/(api|db|models|errors)\.py|openssl_sha256|_hashlib|'match' of|"
                r"'fullmatch' of")),
    ("json + logging (access log)",
     re.compile(r"json/|logging/|'dumps'|c_make_encoder|'write' of '_io.TextIOWrapper'")),
    ("gunicorn HTTP parsing + response", re.compile(r"gunicorn/")),
]


def _bucket(key: tuple[str, int, str]) -> str:
    filename, _, func = key
    text = f"{filename}:{func}"
    for name, pattern in BUCKETS:
        if pattern.search(text):
            return name
    return "other (stdlib, interpreter)"


def analyse(paths: list[str], requests: int) -> dict[str, Any]:
    stats = pstats.Stats(paths[0])
    for p in paths[1:]:
        stats.add(p)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    buckets: dict[str, float] = {}
    top: list[tuple[float, str]] = []
    by_bucket: dict[str, list[tuple[float, str]]] = {}
    for key, (_cc, _nc, tottime, _cum, _callers) in raw.items():
        b = _bucket(key)
        buckets[b] = buckets.get(b, 0.0) + tottime
        name = f"{Path(key[0]).name}:{key[1]}({key[2]})"
        top.append((tottime, name))
        by_bucket.setdefault(b, []).append((tottime, name))
    total = sum(buckets.values())
    per_req_us = {k: v * 1e6 / requests for k, v in sorted(buckets.items(), key=lambda x: -x[1])}
    top.sort(reverse=True)
    return {"requests": requests, "total_us_per_req": total * 1e6 / requests,
            "buckets_us_per_req": per_req_us,
            "top_self_us_per_req": [(name, t * 1e6 / requests) for t, name in top[:20]],
            "top_by_bucket": {b: [(n, t * 1e6 / requests) for t, n in sorted(v, reverse=True)[:6]]
                              for b, v in by_bucket.items()}}


def _load(port: int, keys: list[str], n: int) -> dict[str, Any]:
    if loadgen.have_wrk():
        return loadgen.wrk_load(f"http://127.0.0.1:{port}", "/jobs", keys, BODY, requests=n,
                                connections=CONNECTIONS)
    return loadgen.python_load("127.0.0.1", port, "/jobs", keys, BODY, requests=n,
                               connections=CONNECTIONS)


def run(b: Bench) -> None:
    if not servers.available("gunicorn"):
        b.notes.append("gunicorn not installed: no profile")
        return
    n = 500 if b.quick else 6000
    dbname = "bench_profile"
    url, _, keys = fresh_db(b, dbname)
    prof_dir = Path(tempfile.mkdtemp(prefix="sftq-bench-prof-"))
    spec = ServerSpec("gunicorn sync x1 + cProfile", "gunicorn", workers=1,
                      profile_out=str(prof_dir / "worker"))
    server = servers.start(spec, url, b.out_dir / "logs")
    try:
        _load(server.port, keys, max(200, n // 10))  # warm-up, not profiled
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/health?" + START_QUERY)
        conn.getresponse().read()
        conn.close()
        res = _load(server.port, keys, n)
    finally:
        server.stop()
        b.drop_db(dbname)
    try:
        files = glob.glob(str(prof_dir / "worker.*"))
        if not files:
            raise RuntimeError("the profiled worker left no stats")
        # Requests profiled: the load plus the request that started the profiler.
        out = analyse(files, res["requests"] + 1)
    finally:
        shutil.rmtree(prof_dir, ignore_errors=True)
    out["rps_under_profiler"] = res["rps"]
    b.data[SECTION] = out
    for name, us in out["buckets_us_per_req"].items():
        b.add(SECTION, name, us / 1000, "ms/req",
              note=f"{us / out['total_us_per_req'] * 100:.0f}% of the worker's wall time")
    b.log("largest own times (us per request, under cProfile):")
    for name, us in out["top_self_us_per_req"][:12]:
        b.log(f"  {us:8.1f}  {name}")
    for bucket, items in out["top_by_bucket"].items():
        b.log(f"{bucket}: " + "; ".join(f"{n} {us:.0f}" for n, us in items[:4]))
