"""Webhooks: how long from a transition's commit to the receiver, and what the outbox costs
enqueue.

Latency: the dev stack's delivery loop (`sftq deliver`, a separate process, default poll
interval) delivering to a loopback receiver; a steady trickle of enqueues, then a burst. Each
job's commit time is taken when its enqueue returned; its arrival when the receiver read the
delivery. Goal: p95 < 2 s.

Cost: the outbox trigger's PostgreSQL CPU per job event, measured where it is paid: the
backend's own CPU (from /proc) over sftq._event('queued') called in a loop inside one DO block,
with the trigger dropped (the baseline) and for a user without endpoints, a user whose endpoint
is not subscribed to job.queued, and one whose endpoint gets every event (a delivery row per
event). Set against the PostgreSQL CPU of one whole enqueue (sftq.api_enqueue, one connection,
trigger dropped). Rounds alternate between the variants so drift hits them alike; the best
round of each is kept. A whole-enqueue ratio is too noisy on a shared machine for a cost of a
few percent; the loop isolates it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
from common import FUNCTIONS, Bench, percentile, proc_cpu_seconds, stop_process

from sftq_server import db as dbmod
from sftq_server.webhooks import SecretBox, new_secret

SECTION = "webhooks"
KEY = "bench-webhooks-key-0123456789abcdefghijklmnop"
PAYLOAD = '{"dataset": "accounts/bench/datasets/d", "baseModel": "m"}'


class _Receiver:
    """Loopback receiver: arrival time per job id (from the delivery's body)."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                now = time.time()
                job = json.loads(body)["data"]["id"]
                with receiver.lock:
                    receiver.arrived.setdefault(job, now)
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.send_header("Connection", "close")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _user(conn: psycopg.Connection[Any], name: str, events: list[str] | None,
          url: str = "https://hooks.example.com/bench") -> bytes:
    """A user with a key and (when events is given) one endpoint; answers the key's hash."""
    uid = conn.execute("SELECT sftq.create_user(%s)", (name,)).fetchone()[0]  # type: ignore[index]
    key = conn.execute("SELECT key FROM sftq.issue_key(%s)", (name,)).fetchone()[0]  # type: ignore[index]
    if events is not None:
        eid = str(uuid.uuid4())
        sealed = SecretBox(KEY).seal(new_secret(), eid)
        conn.execute("SELECT sftq.webhook_create(%s, %s, %s, %s, NULL, %s)",
                     (uid, eid, url, events, sealed))
    return hashlib.sha256(str(key).encode()).digest()


def _enqueue(conn: psycopg.Connection[Any], key_hash: bytes) -> str:
    row = conn.execute(dbmod.API_ENQUEUE, (key_hash, "SFT", PAYLOAD, "bench", 4, None)).fetchone()
    assert row is not None
    return str(row[2])


# -- latency ---------------------------------------------------------------------------------

def run_latency(b: Bench, trickle: int, burst: int) -> dict[str, Any]:
    dbname = "bench_webhooks_latency"
    url = b.new_db(dbname)
    receiver = _Receiver()
    with psycopg.connect(url, autocommit=True) as conn:
        key_hash = _user(conn, "hooked", ["job.queued"], receiver.url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFTQ_")}
    env |= {"DATABASE_URL": url, "SFTQ_WEBHOOKS_KEY": KEY, "SFTQ_WEBHOOKS_ALLOW_PRIVATE": "true",
            "PYTHONPATH": str(FUNCTIONS), "PYTHONUNBUFFERED": "1"}
    worker = subprocess.Popen([sys.executable, "-m", "sftq_server.cli.dev", "deliver"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    committed: dict[str, float] = {}
    phases: dict[str, list[str]] = {"trickle": [], "burst": []}
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _enqueue(conn, key_hash)  # warm-up: the worker's first claim and connection
            time.sleep(2.0)
            for i in range(trickle):
                job = _enqueue(conn, key_hash)
                committed[job] = time.time()
                phases["trickle"].append(job)
                time.sleep(0.02 + (i % 7) * 0.012)  # 20-92 ms apart, ~18/s
            time.sleep(1.0)
            for _ in range(burst):
                job = _enqueue(conn, key_hash)
                committed[job] = time.time()
                phases["burst"].append(job)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with receiver.lock:
                if all(j in receiver.arrived for j in committed):
                    break
            time.sleep(0.1)
    finally:
        stop_process(worker)
        receiver.close()
        b.drop_db(dbname)
    out: dict[str, Any] = {}
    for phase, jobs in phases.items():
        ms = [(receiver.arrived[j] - committed[j]) * 1000 for j in jobs if j in receiver.arrived]
        out[phase] = {"n": len(jobs), "delivered": len(ms), "p50_ms": percentile(ms, 50),
                      "p95_ms": percentile(ms, 95), "max_ms": max(ms) if ms else float("nan")}
    return out


# -- enqueue cost ----------------------------------------------------------------------------

def _event_loop_us(conn: psycopg.Connection[Any], pid: int, job: str, n: int) -> float:
    """Backend CPU per sftq._event call (a 'queued' event), n calls in one DO block: the
    outbox trigger's cost per event without client round trips in the way."""
    before = proc_cpu_seconds(pid)
    conn.execute(f"DO $$ BEGIN FOR i IN 1..{int(n)} LOOP PERFORM sftq._event('{job}', now(), "
                 "'user:bench', 'queued', 'QUEUED'); END LOOP; END $$")
    return (proc_cpu_seconds(pid) - before) * 1e6 / n


def run_cost(b: Bench, n_events: int, n_enqueues: int, rounds: int) -> dict[str, Any]:
    dbs = {"no trigger": "bench_webhooks_notrigger", "no endpoint": "bench_webhooks_none",
           "endpoint, not subscribed": "bench_webhooks_term",
           "endpoint, every event": "bench_webhooks_all"}
    events = {"no trigger": None, "no endpoint": None,
              "endpoint, not subscribed": ["job.succeeded"], "endpoint, every event": ["job.*"]}
    conns: dict[str, psycopg.Connection[Any]] = {}
    jobs: dict[str, str] = {}
    pids: dict[str, int] = {}
    keys: dict[str, bytes] = {}
    try:
        for name, db in dbs.items():
            conn = psycopg.connect(b.new_db(db), autocommit=True, prepare_threshold=None)
            conns[name] = conn
            if name == "no trigger":
                conn.execute("DROP TRIGGER job_events_webhooks ON sftq.job_events")
            keys[name] = _user(conn, "bench", events[name])
            jobs[name] = _enqueue(conn, keys[name])
            pids[name] = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        per_event: dict[str, float] = {}
        enqueue: dict[str, float] = {}
        for name, conn in conns.items():  # warm-up: plans, caches
            _event_loop_us(conn, pids[name], jobs[name], max(100, n_events // 20))
        # Rounds alternate between the variants, so drift hits them alike; keep each one's best.
        for _ in range(rounds):
            for name, conn in conns.items():
                us = _event_loop_us(conn, pids[name], jobs[name], n_events)
                per_event[name] = min(per_event.get(name, us), us)
            for name in ("no trigger", "no endpoint"):
                conn = conns[name]
                before = proc_cpu_seconds(pids[name])
                for _ in range(n_enqueues):
                    _enqueue(conn, keys[name])
                us = (proc_cpu_seconds(pids[name]) - before) * 1e6 / n_enqueues
                enqueue[name] = min(enqueue.get(name, us), us)
        written = conns["endpoint, every event"].execute(
            "SELECT count(*) FROM sftq.webhook_deliveries").fetchone()
    finally:
        for conn in conns.values():
            conn.close()
        for db in dbs.values():
            b.drop_db(db)
    base = per_event["no trigger"]
    return {"event_us": per_event, "extra_us": {k: v - base for k, v in per_event.items()},
            "enqueue_us": enqueue, "deliveries_written": int(written[0]) if written else 0,
            "n_events": n_events, "n_enqueues": n_enqueues, "rounds": rounds}


def run(b: Bench) -> None:
    trickle, burst = (30, 20) if b.quick else (300, 100)
    lat = run_latency(b, trickle, burst)
    b.data[SECTION] = {"latency": lat}
    for phase in ("trickle", "burst"):
        r = lat[phase]
        note = f"p50 {r['p50_ms']:.0f} ms, max {r['max_ms']:.0f} ms, " \
               f"{r['delivered']}/{r['n']} delivered"
        b.add(SECTION, f"commit to receiver p95, sftq deliver, {phase} of {r['n']}",
              r["p95_ms"] / 1000, "s", goal="< 2 s",
              ok=r["delivered"] == r["n"] and r["p95_ms"] < 2000, note=note)
    n_events, n_enqueues, rounds = (2000, 200, 2) if b.quick else (20000, 2000, 5)
    cost = run_cost(b, n_events, n_enqueues, rounds)
    b.data[SECTION]["enqueue_cost"] = cost
    enqueue_us = cost["enqueue_us"]["no trigger"]
    b.add(SECTION, "enqueue PostgreSQL CPU, outbox trigger dropped", enqueue_us, "us",
          note=f"sftq.api_enqueue, 1 connection, best of {rounds} rounds of {n_enqueues}; "
          f"with the trigger, user without endpoints: {cost['enqueue_us']['no endpoint']:.0f} us")
    for name in ("no endpoint", "endpoint, not subscribed", "endpoint, every event"):
        extra = cost["extra_us"][name]
        b.add(SECTION, f"outbox trigger CPU per event, {name}", extra, "us",
              note=f"{extra / enqueue_us * 100:.1f}% of an enqueue; sftq._event in a loop "
              f"({cost['event_us']['no trigger']:.1f} us without the trigger)")
