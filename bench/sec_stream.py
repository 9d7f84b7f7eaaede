"""The live stream on one instance (functions/jobs_stream.py under uvicorn, as functions-framework
--asgi runs it): 1,000 concurrent streams (100 with --quick) of one user's jobs.

- idle: database queries per second counted by PostgreSQL itself (pg_stat_user_functions calls
  of the stream's functions, the server's only queries), the server's RSS and CPU;
- commit-to-frame: single transitions committed at random moments; the time from the commit
  returning to the frame arriving, over every stream;
- burst: one transaction admitting 100 jobs (one tick's transitions) must reach every stream,
  each frame exactly once (checked by the set of ids against the database's rows).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from common import FUNCTIONS, Bench, percentile, stop_process

from sftq_server.pgcluster import free_port

SECTION = "stream"
PAYLOAD = '{"dataset": "accounts/bench/datasets/d", "baseModel": "m"}'
STREAM_FUNCTIONS = ("stream_poll", "stream_backlog", "api_stream_open")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _calls(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT COALESCE(sum(calls), 0) FROM pg_stat_user_functions "
                       "WHERE schemaname = 'sftq' AND funcname = ANY(%s)",
                       (list(STREAM_FUNCTIONS),)).fetchone()
    return int(row[0]) if row else 0


class Streams:
    """N raw SSE connections in one event loop: frames by id, with their arrival times."""

    def __init__(self, port: int, key: str, n: int) -> None:
        self.port, self.key, self.n = port, key, n
        self.frames: list[dict[str, float]] = [{} for _ in range(n)]  # id -> arrival
        self.job_of: dict[str, str] = {}  # frame id -> "job_id state"
        self.connected = 0
        self.tasks: list[asyncio.Task[None]] = []

    async def _one(self, i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20)
        writer.write((f"GET /functions/v1/jobs-api/jobs/stream HTTP/1.1\r\nHost: bench\r\n"
                      f"Authorization: Bearer {self.key}\r\nAccept: text/event-stream\r\n\r\n"
                      ).encode())
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"stream {i}: {status!r}")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        self.connected += 1
        mine = self.frames[i]
        current = ""
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                if line.startswith(b"id: "):
                    current = line[4:].strip().decode()
                elif line.startswith(b"data: ") and current:
                    mine.setdefault(current, time.monotonic())
                    if current not in self.job_of:
                        d = json.loads(line[6:])
                        self.job_of[current] = f"{d.get('id') or d.get('job_id')} {d.get('state')}"
        finally:
            writer.close()

    async def start(self) -> None:
        for i in range(self.n):
            self.tasks.append(asyncio.create_task(self._one(i)))
            if i % 50 == 49:
                await asyncio.sleep(0.05)
        deadline = time.monotonic() + 120
        while self.connected < self.n:
            failed = [t for t in self.tasks if t.done() and t.exception()]
            if failed:
                raise RuntimeError(f"a stream failed: {failed[0].exception()!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {self.connected} of {self.n} streams connected")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _measure(b: Bench, url: str, port: int, pid: int, key: str, user: int,
                   n: int, idle_s: float, samples: int, burst: int) -> dict[str, Any]:
    out: dict[str, Any] = {"streams": n}
    streams = Streams(port, key, n)
    with psycopg.connect(url, autocommit=True) as conn:
        t0 = time.monotonic()
        await streams.start()
        out["connect_s"] = round(time.monotonic() - t0, 2)
        # A backend reports its function counts when idle, at most once a second, else within
        # 10 s: let the opens' counts land before the window, and the window's after it.
        await asyncio.sleep(11.0)
        # -- idle ---------------------------------------------------------------------------
        conn.execute("SELECT pg_stat_clear_snapshot()")
        calls0, cpu0, t0 = _calls(conn), _cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(idle_s)
        elapsed = time.monotonic() - t0
        cpu = _cpu_seconds(pid) - cpu0
        await asyncio.sleep(11.0)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        calls = _calls(conn) - calls0
        # The 11 s of reporting delay also counted calls: scale to the window they fall in.
        elapsed_counted = time.monotonic() - t0
        out["idle"] = {"seconds": round(elapsed_counted, 1), "queries": calls,
                       "queries_per_s": round(calls / elapsed_counted, 2),
                       "cpu_share": round(cpu / elapsed, 4), "rss_mib": round(_rss_mib(pid), 1)}
        # -- commit to frame -------------------------------------------------------------------
        queued = [str(r[0]) for r in conn.execute(
            "SELECT id FROM sftq.jobs WHERE user_id = %s AND state = 'QUEUED' "
            "ORDER BY created_at, id", (user,))]
        lat: list[float] = []
        for job in queued[:samples]:
            await asyncio.sleep(random.uniform(0.3, 1.3))
            conn.execute("SELECT * FROM sftq.cancel(%s, %s)", (user, job))
            committed = time.monotonic()
            eid = str(conn.execute("SELECT max(id) FROM sftq.job_events WHERE job_id = %s",
                                   (job,)).fetchone()[0])  # type: ignore[index]
            deadline = time.monotonic() + 10
            while any(eid not in f for f in streams.frames) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            lat += [f[eid] - committed for f in streams.frames if eid in f]
            missing = sum(1 for f in streams.frames if eid not in f)
            if missing:
                raise RuntimeError(f"{missing} streams never got frame {eid}")
        out["latency"] = {"samples": len(lat), "p50_s": round(percentile(lat, 50), 3),
                          "p99_s": round(percentile(lat, 99), 3), "max_s": round(max(lat), 3)}
        # -- one tick's burst ------------------------------------------------------------------
        # One transaction ending `burst` jobs at once, as a tick that times out or reconciles
        # many jobs does: every stream must get every frame, once.
        before = [set(f) for f in streams.frames]
        with conn.transaction():
            conn.execute("SELECT (sftq.cancel(%s, j.id)).action FROM sftq.jobs j "
                         "WHERE j.user_id = %s AND j.state = 'QUEUED'", (user, user))
            ids = {str(r[0]) for r in conn.execute(
                "SELECT e.id FROM sftq.job_events e JOIN sftq.jobs j ON j.id = e.job_id "
                "WHERE j.user_id = %s AND e.event = 'cancelled' AND e.txid = pg_current_xact_id()",
                (user,))}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(ids <= f.keys() for f in streams.frames):
            await asyncio.sleep(0.05)
        got_all = sum(1 for f in streams.frames if ids <= f.keys())
        extra = sum(len(set(f) - before[i] - ids) for i, f in enumerate(streams.frames))
        out["burst"] = {"transitions": len(ids), "streams_with_all": got_all,
                        "unexpected_frames": extra}
        await streams.stop()
    return out


def run(b: Bench) -> None:
    n = 100 if b.quick else 1000
    idle_s, samples, burst = (5.0, 5, 20) if b.quick else (30.0, 20, 100)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    dbname = "bench_stream"
    url = b.new_db(dbname)
    with b.admin() as conn:
        conn.execute(f'ALTER DATABASE "{dbname}" SET track_functions = \'pl\'')
    with psycopg.connect(url, autocommit=True) as conn:
        user = int(conn.execute("SELECT sftq.create_user('streamer', 1000)").fetchone()[0])  # type: ignore[index]
        key = str(conn.execute("SELECT key FROM sftq.issue_key('streamer')").fetchone()[0])  # type: ignore[index]
        for _ in range(samples + burst):
            conn.execute("SELECT sftq.enqueue(%s, 'SFT', %s::jsonb, NULL, 4)", (user, PAYLOAD))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SFTQ_", "DATABASE_URL"))}
    env |= {"DATABASE_URL": url, "PYTHONPATH": str(FUNCTIONS), "SFTQ_DB_POOL_MAX": "4"}
    log = (b.out_dir / "stream-server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "jobs_stream:asgi_app", "--factory", "--host",
         "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log",
         "--timeout-graceful-shutdown", "2"],
        cwd=FUNCTIONS, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                import socket

                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        r = asyncio.run(_measure(b, url, port, proc.pid, key, user, n, idle_s, samples, burst))
    finally:
        stop_process(proc)
        log.close()
    b.data[SECTION] = r
    idle, lat, burst_r = r["idle"], r["latency"], r["burst"]
    b.add(SECTION, f"{n:,} idle streams: database queries per second", idle["queries_per_s"],
          "q/s", goal="<= 2", ok=idle["queries_per_s"] <= 2,
          note=f"{idle['queries']} calls of the stream functions in {idle['seconds']} s "
               "(pg_stat_user_functions)")
    b.add(SECTION, f"{n:,} idle streams: server RSS", idle["rss_mib"], "MiB", goal="< 300",
          ok=idle["rss_mib"] < 300)
    b.add(SECTION, f"{n:,} idle streams: server CPU, share of one core",
          idle["cpu_share"] * 100, "%", goal="< 10", ok=idle["cpu_share"] < 0.10)
    b.add(SECTION, "commit to frame at the client, p50", lat["p50_s"], "s", goal="<= 1.2",
          ok=lat["p50_s"] <= 1.2, note=f"{lat['samples']} frames ({samples} transitions x {n})")
    b.add(SECTION, "commit to frame at the client, p99", lat["p99_s"], "s", goal="<= 2",
          ok=lat["p99_s"] <= 2.0, note=f"max {lat['max_s']} s")
    b.add(SECTION, f"one tick's {burst_r['transitions']} transitions: streams with every frame",
          burst_r["streams_with_all"], "streams", goal=f"= {n}",
          ok=burst_r["streams_with_all"] == n and burst_r["unexpected_frames"] == 0,
          note=f"{burst_r['unexpected_frames']} unexpected or repeated frames")
    b.drop_db(dbname)
