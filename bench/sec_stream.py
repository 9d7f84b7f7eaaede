"""The live stream on one instance (functions/jobs_stream.py under uvicorn, as functions-framework
--asgi runs it): 1,000 concurrent streams (100 with --quick), GET /jobs/stream of 100 users
(20 with --quick), the same number of streams each.

- idle: database queries per second counted by PostgreSQL itself (pg_stat_user_functions calls
  of the stream's functions, the server's only queries), the server's RSS and CPU;
- commit-to-frame: single transitions (a cancel of one user's queued job) committed at random
  moments; the time from the commit returning to the frame arriving, over every stream of
  that user;
- burst: one tick's work, the 100 users' head jobs (20 with --quick) admitted in ONE
  transaction by the real admission (sftq.admit_for_quota), every stream's user among them.
  Every stream must get every status frame of its user's jobs that the transaction wrote
  exactly once: each frame's id is counted per stream, so a repeated id or a missing one
  fails the row, and a frame nobody expected (another user's job, say) is counted too;
- queue frames at the end of a tick: the one per-tick cost that depends on who watches. When
  a tick finishes, a trigger on sftq.scheduler_ticks writes queue frames for every watched
  user (sftq.stream_queue_refresh today). Its database time per tick with 1, 10 and 100
  distinct watched users (100 streams open through a second server, spread over them), on a
  queue of 10,000 jobs (2,000 with --quick) where every tick admits the job at the front, so
  every watched job's position moves and gets a frame. Read from pg_stat_xact_user_functions
  inside the tick's finishing transaction: the time spent in the trigger functions (with all
  they call), nothing else of the tick. The ratio 100 users / 1 user has a goal (<= 3x): a
  step that walks the queue once for all watched users meets it, one walk per user does not.
  It runs on its own database while the idle counts of the first part settle.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dataset
import psycopg
from common import FUNCTIONS, Bench, percentile, stop_process

from sftq_server.dev.pgcluster import free_port

SECTION = "stream"
PAYLOAD = '{"dataset": "accounts/bench/datasets/d", "baseModel": "m"}'
STREAM_FUNCTIONS = ("stream_poll", "stream_backlog", "api_stream_open")
# A backend reports its function counts when idle, at most once a second, else within 10 s.
STATS_SETTLE_S = 11.0
# After the burst's last expected frame, how long repeats may still arrive and be counted.
REPEAT_GRACE_S = 2.0
WATCHED = (1, 10, 100)
TICK_STREAMS = 100

# Events that make a frame (sftq._stream_frame): transitions, the first event, provider states.
FRAME_EVENTS = "(e.to_state IS NOT NULL OR e.event IN ('queued', 'provider_state'))"

# The database time of the end-of-tick step: every user trigger on sftq.scheduler_ticks (the
# queue-frame refresh fires from one when tick_finish records the end), as this backend has
# spent in them and not yet reported.
TRIGGER_TIME_SQL = """
SELECT COALESCE(sum(f.total_time), 0), COALESCE(sum(f.calls), 0)
  FROM pg_stat_xact_user_functions f
 WHERE f.funcid IN (SELECT t.tgfoid FROM pg_trigger t
                     WHERE t.tgrelid = 'sftq.scheduler_ticks'::regclass AND NOT t.tgisinternal)
"""


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
    """Raw SSE connections (GET /jobs/stream) in one event loop. Every frame a stream receives
    is kept, in order, with its arrival time: a repeated id stays visible."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.keys: list[str] = []
        self.users: list[int] = []
        self.frames: list[list[tuple[str, str, float]]] = []  # (id, job id, arrival)
        self.first: list[dict[str, float]] = []  # id -> first arrival
        self.tasks: list[asyncio.Task[None]] = []
        self.ready: list[asyncio.Event] = []
        self.open: set[int] = set()

    async def _one(self, i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20)
        try:
            writer.write((f"GET /functions/v1/jobs-api/jobs/stream HTTP/1.1\r\nHost: bench\r\n"
                          f"Authorization: Bearer {self.keys[i]}\r\n"
                          "Accept: text/event-stream\r\n\r\n").encode())
            await writer.drain()
            status = await reader.readline()
            if b" 200 " not in status:
                raise RuntimeError(f"stream {i}: {status!r}")
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            self.ready[i].set()
            frames, first = self.frames[i], self.first[i]
            current = ""
            while True:
                line = await reader.readline()
                if not line:
                    return
                if line.startswith(b"id: "):
                    current = line[4:].strip().decode()
                elif line.startswith(b"data: ") and current:
                    arrived = time.monotonic()
                    d = json.loads(line[6:])
                    frames.append((current, str(d.get("job_id") or d.get("id")), arrived))
                    first.setdefault(current, arrived)
                    current = ""  # a frame has one data line; the next needs its own id
        finally:
            writer.close()

    async def add(self, keys: list[str], users: list[int]) -> list[int]:
        """Open one stream per key and wait until every one is answered 200."""
        new = []
        for key, user in zip(keys, users, strict=True):
            i = len(self.keys)
            self.keys.append(key)
            self.users.append(user)
            self.frames.append([])
            self.first.append({})
            self.ready.append(asyncio.Event())
            self.tasks.append(asyncio.create_task(self._one(i)))
            self.open.add(i)
            new.append(i)
            if len(new) % 50 == 0:
                await asyncio.sleep(0.05)
        deadline = time.monotonic() + 120
        while not all(self.ready[i].is_set() for i in new):
            failed = [self.tasks[i] for i in new if self.tasks[i].done()]
            if failed:
                exc = failed[0].exception() if not failed[0].cancelled() else None
                raise RuntimeError(f"a stream failed: {exc!r}")
            if time.monotonic() > deadline:
                n = sum(self.ready[i].is_set() for i in new)
                raise RuntimeError(f"only {n} of {len(new)} streams connected")
            await asyncio.sleep(0.1)
        return new

    async def close(self, indexes: list[int]) -> None:
        for i in indexes:
            self.tasks[i].cancel()
            self.open.discard(i)
        await asyncio.gather(*(self.tasks[i] for i in indexes), return_exceptions=True)

    async def stop(self) -> None:
        await self.close(sorted(self.open))


@contextmanager
def _server(b: Bench, url: str, log_name: str) -> Iterator[tuple[int, int]]:
    """The stream function under uvicorn on loopback: (port, pid)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SFTQ_", "DATABASE_URL"))}
    env |= {"DATABASE_URL": url, "PYTHONPATH": str(FUNCTIONS), "SFTQ_DB_POOL_MAX": "4"}
    log = (b.out_dir / log_name).open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "jobs_stream:asgi_app", "--factory", "--host",
         "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log",
         "--timeout-graceful-shutdown", "2"],
        cwd=FUNCTIONS, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"the stream server exited; see {log.name}") from None
                time.sleep(0.1)
        yield port, proc.pid
    finally:
        stop_process(proc)
        log.close()


# --- 1. idle, commit to frame, one tick's burst ------------------------------------------------

def _setup_streams_db(url: str, users: int) -> tuple[list[int], list[str]]:
    """`users` users (cap 1), each with a key and two queued jobs of 1 GPU: the head (the
    burst admits it) and one more (a latency sample may cancel it)."""
    ids, keys = [], []
    with psycopg.connect(url, autocommit=True) as conn:
        for u in range(users):
            name = f"streamer{u:03d}"
            ids.append(int(conn.execute("SELECT sftq.create_user(%s)", (name,)).fetchone()[0]))  # type: ignore[index]
            keys.append(str(conn.execute("SELECT key FROM sftq.issue_key(%s)",
                                         (name,)).fetchone()[0]))  # type: ignore[index]
        for _ in range(2):
            for uid in ids:
                conn.execute("SELECT sftq.enqueue(%s, 'SFT', %s::jsonb, NULL, 1)", (uid, PAYLOAD))
    return ids, keys


async def _latency(conn: psycopg.Connection[Any], streams: Streams, user_ids: list[int],
                   samples: int) -> dict[str, Any]:
    rng = random.Random(12)
    lat: list[float] = []
    for u in rng.sample(range(len(user_ids)), samples):
        uid = user_ids[u]
        mine = [i for i in streams.open if streams.users[i] == uid]
        job = conn.execute("SELECT id FROM sftq.jobs WHERE user_id = %s AND state = 'QUEUED' "
                           "ORDER BY created_at DESC, id DESC LIMIT 1", (uid,)).fetchone()
        assert job is not None
        await asyncio.sleep(rng.uniform(0.3, 1.3))
        conn.execute("SELECT * FROM sftq.cancel(%s, %s)", (uid, job[0]))
        committed = time.monotonic()
        eid = str(conn.execute("SELECT max(id) FROM sftq.job_events WHERE job_id = %s",
                               (job[0],)).fetchone()[0])  # type: ignore[index]
        deadline = time.monotonic() + 10
        while (any(eid not in streams.first[i] for i in mine)
               and time.monotonic() < deadline):
            await asyncio.sleep(0.01)
        missing = sum(1 for i in mine if eid not in streams.first[i])
        if missing:
            raise RuntimeError(f"{missing} streams never got frame {eid}")
        lat += [streams.first[i][eid] - committed for i in mine]
    return {"samples": len(lat), "transitions": samples, "p50_s": round(percentile(lat, 50), 3),
            "p99_s": round(percentile(lat, 99), 3), "max_s": round(max(lat), 3)}


def frame_counts(ids: list[str], mark: int, want: set[str]) -> tuple[int, int, int]:
    """One stream's frame ids in arrival order, `mark` of them received before the burst, and
    the ids the burst must bring it: (repeated, missing, unexpected). A frame after the mark
    is repeated when its id came before on this stream (in the burst or earlier), unexpected
    when it is new but not wanted; a wanted id that never came is missing."""
    seen = Counter(ids[:mark])
    repeated = unexpected = 0
    for fid in ids[mark:]:
        if seen[fid]:
            repeated += 1
        elif fid not in want:
            unexpected += 1
        seen[fid] += 1
    missing = sum(1 for fid in want if not seen[fid])
    return repeated, missing, unexpected


async def _burst(conn: psycopg.Connection[Any], streams: Streams,
                 user_ids: list[int]) -> dict[str, Any]:
    """One tick's admissions in one transaction; each stream's frames counted by id."""
    mark = {i: len(streams.frames[i]) for i in streams.open}
    before = conn.execute("SELECT COALESCE(max(id), 0) FROM sftq.job_events").fetchone()
    assert before is not None
    # The budget fits every user's 1-GPU head; the walk admits one job per user per tick.
    answer = conn.execute("SELECT sftq.admit_for_quota(%s, 0, interval '5 minutes')",
                          (len(user_ids),)).fetchone()
    assert answer is not None
    admitted = answer[0]["jobs"]
    if {int(j["user_id"]) for j in admitted} != set(user_ids):
        raise RuntimeError(f"the admission took {len(admitted)} jobs, not one of each of "
                           f"the {len(user_ids)} users")
    expected: dict[int, set[str]] = {uid: set() for uid in user_ids}
    for eid, uid in conn.execute(
            "SELECT e.id, j.user_id FROM sftq.job_events e JOIN sftq.jobs j ON j.id = e.job_id "
            f"WHERE e.id > %s AND {FRAME_EVENTS}", (before[0],)):
        expected.setdefault(int(uid), set()).add(str(eid))
    transitions = sum(len(v) for v in expected.values())

    def complete(i: int) -> bool:
        return expected[streams.users[i]] <= streams.first[i].keys()

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(complete(i) for i in streams.open):
        await asyncio.sleep(0.05)
    await asyncio.sleep(REPEAT_GRACE_S)
    per_stream = [frame_counts([fid for fid, _, _ in streams.frames[i]], mark[i],
                               expected[streams.users[i]]) for i in sorted(streams.open)]
    exactly_once = sum(1 for r, m, _ in per_stream if r == 0 and m == 0)
    return {"transitions": transitions, "users": len(user_ids),
            "streams_exactly_once": exactly_once,
            "repeated_frames": sum(r for r, _, _ in per_stream),
            "streams_with_repeats": sum(1 for r, _, _ in per_stream if r),
            "missing_frames": sum(m for _, m, _ in per_stream),
            "streams_with_gaps": sum(1 for _, m, _ in per_stream if m),
            "unexpected_frames": sum(u for _, _, u in per_stream),
            # A stream the server ended (reconnect) before the bench closed it misses
            # whatever came after: count them, so a gap says whether that was its cause.
            "streams_ended_by_server": sum(1 for i in streams.open if streams.tasks[i].done())}


# --- 2. queue frames at the end of a tick --------------------------------------------------------

def _setup_ticks_db(url: str, queued: int, history: int,
                    fronts: int) -> list[tuple[int, str]]:
    """A round-robin queue over 1,000 users; keys for WATCHED[-1] of them spread over it; and
    `fronts` users with one job each ahead of everything, one admitted per tick."""
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        dataset.load(conn, queued=queued, history=history)
        step = dataset.USERS // WATCHED[-1]
        watched = []
        for k in range(WATCHED[-1]):
            name = f"u{(k + 1) * step:04d}"
            key = conn.execute("SELECT key FROM sftq.issue_key(%s)", (name,)).fetchone()
            uid = conn.execute("SELECT id FROM sftq.users WHERE name = %s", (name,)).fetchone()
            assert key is not None and uid is not None
            watched.append((int(uid[0]), str(key[0])))
        for f in range(fronts):
            uid = conn.execute("SELECT sftq.create_user(%s)", (f"front{f:02d}",)).fetchone()
            assert uid is not None
            conn.execute("SELECT sftq.enqueue(%s, 'SFT', %s::jsonb, NULL, 4, NULL, "
                         "%s::timestamptz - %s * interval '1 minute')",
                         (uid[0], PAYLOAD, dataset.T0, fronts - f))
        conn.execute("VACUUM ANALYZE sftq.users")
    return watched


def _one_tick(conn: psycopg.Connection[Any]) -> dict[str, float]:
    """A tick's database side: begin, admit the front job (4 GPUs), finish; the finishing
    transaction's time in the scheduler_ticks triggers. Then the admitted job ends, so every
    tick sees the same running set."""
    tick = conn.execute("SELECT sftq.tick_begin('bench', interval '2 minutes')").fetchone()
    assert tick is not None
    admitted = conn.execute("SELECT job_id FROM sftq.admit(4)").fetchall()
    if len(admitted) != 1:
        raise RuntimeError(f"a tick admitted {len(admitted)} jobs, not the one at the front")
    before = conn.execute("SELECT COALESCE(max(id), 0) FROM sftq.stream_queue_events").fetchone()
    assert before is not None
    with conn.transaction():
        # The view shows what the backend has not reported yet, which may include earlier
        # transactions' calls; inside one transaction nothing is reported, so the difference
        # is tick_finish's alone.
        start = conn.execute(TRIGGER_TIME_SQL).fetchone()
        t0 = time.perf_counter()
        conn.execute("SELECT sftq.tick_finish(%s, %s::jsonb)",
                     (tick[0], json.dumps({"quota_limit": 64, "quota_usage": 4})))
        statement_ms = (time.perf_counter() - t0) * 1000
        end = conn.execute(TRIGGER_TIME_SQL).fetchone()
        assert start is not None and end is not None
    step_ms, calls = float(end[0]) - float(start[0]), int(end[1]) - int(start[1])
    if not calls:
        raise RuntimeError("tick_finish ran no trigger on sftq.scheduler_ticks: the queue "
                           "frames are written elsewhere now; teach bench/sec_stream.py where")
    frames = conn.execute("SELECT count(*) FROM sftq.stream_queue_events WHERE id > %s",
                          (before[0],)).fetchone()
    job = admitted[0][0]
    conn.execute("SELECT sftq.record_submitted(%s, %s, 'JOB_STATE_RUNNING')",
                 (job, f"accounts/bench/supervisedFineTuningJobs/{job}"))
    conn.execute("SELECT sftq.observe_provider_job(%s, '{\"state\": \"JOB_STATE_COMPLETED\"}')",
                 (job,))
    return {"step_ms": step_ms, "finish_ms": statement_ms,
            "frames": float(frames[0]) if frames else 0.0}


async def _queue_frames(url: str, port: int, watched: list[tuple[int, str]],
                        reps: int) -> dict[str, Any]:
    streams = Streams(port)
    out: dict[str, Any] = {"streams": TICK_STREAMS}
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        for n_users in WATCHED:
            # TICK_STREAMS streams spread evenly over the first n_users watched users: close
            # the surplus of the users already watched, open the others' (a user stays
            # watched as long as one of its streams is open).
            per_user = TICK_STREAMS // n_users
            have: dict[int, list[int]] = {}
            for i in sorted(streams.open):
                have.setdefault(streams.users[i], []).append(i)
            await streams.close([i for ids in have.values() for i in ids[per_user:]])
            keys, users = [], []
            for uid, key in watched[:n_users]:
                more = per_user - min(per_user, len(have.get(uid, [])))
                keys += [key] * more
                users += [uid] * more
            await streams.add(keys, users)
            count = conn.execute("SELECT count(DISTINCT user_id) FROM sftq.stream_watchers "
                                 "WHERE expires_at > now()").fetchone()
            if not count or int(count[0]) != n_users:
                raise RuntimeError(f"{count} users watched, not {n_users}")
            ticks = [await asyncio.to_thread(_one_tick, conn) for _ in range(1 + reps)]
            timed = ticks[1:]  # the first tick after new watchers writes every frame anew
            out[str(n_users)] = {
                "step_ms": round(statistics.median(t["step_ms"] for t in timed), 2),
                "step_ms_all": [round(t["step_ms"], 2) for t in ticks],
                "tick_finish_ms": round(statistics.median(t["finish_ms"] for t in timed), 2),
                "frames_per_tick": statistics.median(t["frames"] for t in timed)}
    await streams.stop()
    return out


# --- the run -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TickPlan:
    """The queue-frame row's database, its stream server, and its sizes."""

    url: str
    port: int
    queued: int
    history: int
    reps: int


async def _measure(url: str, port: int, pid: int, user_ids: list[int], keys: list[str],
                   n: int, idle_s: float, samples: int, plan: TickPlan) -> dict[str, Any]:
    out: dict[str, Any] = {"streams": n, "users": len(user_ids)}
    streams = Streams(port)
    with psycopg.connect(url, autocommit=True) as conn:
        t0 = time.monotonic()
        await streams.add([keys[i % len(keys)] for i in range(n)],
                          [user_ids[i % len(keys)] for i in range(n)])
        out["connect_s"] = round(time.monotonic() - t0, 2)
        opened = time.monotonic()
        # -- commit to frame -------------------------------------------------------------------
        out["latency"] = await _latency(conn, streams, user_ids, samples)
        # While the opens' function counts land, the queue-frame row's database is loaded
        # (another database: function counts are per database).
        watched = await asyncio.to_thread(_setup_ticks_db, plan.url, plan.queued, plan.history,
                                          len(WATCHED) * (1 + plan.reps))
        await asyncio.sleep(max(0.0, STATS_SETTLE_S - (time.monotonic() - opened)))
        # -- idle ------------------------------------------------------------------------------
        conn.execute("SELECT pg_stat_clear_snapshot()")
        calls0, cpu0, t0 = _calls(conn), _cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(idle_s)
        elapsed = time.monotonic() - t0
        cpu = _cpu_seconds(pid) - cpu0
        rss = _rss_mib(pid)
        # While the window's counts land, the queue-frame row runs on its own database and
        # server: this instance stays idle.
        settle = time.monotonic()
        out["queue_frames"] = await _queue_frames(plan.url, plan.port, watched, plan.reps)
        await asyncio.sleep(max(0.0, STATS_SETTLE_S - (time.monotonic() - settle)))
        conn.execute("SELECT pg_stat_clear_snapshot()")
        calls = _calls(conn) - calls0
        # The reporting delay also counted calls: scale to the window they fall in.
        elapsed_counted = time.monotonic() - t0
        out["idle"] = {"seconds": round(elapsed_counted, 1), "queries": calls,
                       "queries_per_s": round(calls / elapsed_counted, 2),
                       "cpu_share": round(cpu / elapsed, 4), "rss_mib": round(rss, 1)}
        # -- one tick's burst ------------------------------------------------------------------
        out["burst"] = await _burst(conn, streams, user_ids)
        await streams.stop()
    return out


def run(b: Bench) -> None:
    n, n_users = (100, 20) if b.quick else (1000, 100)
    idle_s, samples = (3.0, 5) if b.quick else (30.0, 20)
    queued, history, reps = (2_000, 2_000, 2) if b.quick else (10_000, 10_000, 5)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    dbname, ticks_db = "bench_stream", "bench_stream_ticks"
    url, ticks_url = b.new_db(dbname), b.new_db(ticks_db)
    with b.admin() as conn:
        for name in (dbname, ticks_db):
            conn.execute(f'ALTER DATABASE "{name}" SET track_functions = \'pl\'')
    user_ids, keys = _setup_streams_db(url, n_users)
    with _server(b, url, "stream-server.log") as (port, pid), \
            _server(b, ticks_url, "stream-ticks-server.log") as (ticks_port, _):
        plan = TickPlan(ticks_url, ticks_port, queued, history, reps)
        r = asyncio.run(_measure(url, port, pid, user_ids, keys, n, idle_s, samples, plan))
    r["queue_frames"]["queued"] = queued
    b.data[SECTION] = r
    idle, lat, burst, qf = r["idle"], r["latency"], r["burst"], r["queue_frames"]
    b.add(SECTION, f"{n:,} idle streams: database queries per second", idle["queries_per_s"],
          "q/s", goal="<= 2", ok=idle["queries_per_s"] <= 2,
          note=f"{n_users} users; {idle['queries']} calls of the stream functions in "
               f"{idle['seconds']} s (pg_stat_user_functions)")
    b.add(SECTION, f"{n:,} idle streams: server RSS", idle["rss_mib"], "MiB", goal="< 300",
          ok=idle["rss_mib"] < 300)
    b.add(SECTION, f"{n:,} idle streams: server CPU, share of one core",
          idle["cpu_share"] * 100, "%", goal="< 10", ok=idle["cpu_share"] < 0.10)
    b.add(SECTION, "commit to frame at the client, p50", lat["p50_s"], "s", goal="<= 1.2",
          ok=lat["p50_s"] <= 1.2,
          note=f"{lat['samples']} frames ({samples} transitions x {n // n_users} streams)")
    b.add(SECTION, "commit to frame at the client, p99", lat["p99_s"], "s", goal="<= 2",
          ok=lat["p99_s"] <= 2.0, note=f"max {lat['max_s']} s")
    b.add(SECTION, f"one tick's {burst['transitions']} admissions: streams with every frame "
                   "once", burst["streams_exactly_once"], "streams", goal=f"= {n}",
          ok=burst["streams_exactly_once"] == n and burst["unexpected_frames"] == 0,
          note=f"{burst['users']} users; {burst['repeated_frames']} repeated "
               f"({burst['streams_with_repeats']} streams), {burst['missing_frames']} missing "
               f"({burst['streams_with_gaps']} streams), {burst['unexpected_frames']} unexpected; "
               f"{burst['streams_ended_by_server']} streams ended by the server")
    for k in WATCHED:
        q = qf[str(k)]
        b.add(SECTION, f"end-of-tick queue frames, {k} watched user{'s' if k > 1 else ''}: "
                       "DB time", q["step_ms"], "ms",
              note=f"{q['frames_per_tick']:.0f} frames a tick; {queued:,} queued; "
                   f"{TICK_STREAMS} streams; tick_finish {q['tick_finish_ms']:.1f} ms")
    first, last = qf[str(WATCHED[0])], qf[str(WATCHED[-1])]
    ratio = last["step_ms"] / max(first["step_ms"], 1e-6)
    qf["ratio"] = round(ratio, 2)
    b.add(SECTION, f"end-of-tick queue frames: {WATCHED[-1]} watched users / 1", ratio, "x",
          note="the trigger's database time per tick (pg_stat_xact_user_functions); it "
               "writes 100x the frames")
    # What must not grow with the number of watchers is the work done for each of them: the
    # queue walk, the admission walk and the forecast are shared, so a frame costs no more
    # when many users watch than when one does.
    per_frame = ((last["step_ms"] / max(last["frames_per_tick"], 1))
                 / max(first["step_ms"] / max(first["frames_per_tick"], 1), 1e-6))
    qf["per_frame_ratio"] = round(per_frame, 3)
    b.add(SECTION, f"end-of-tick queue frames, cost per frame: {WATCHED[-1]} watched users / 1",
          per_frame, "x", goal="<= 1", ok=per_frame <= 1,
          note="shared work (one queue view for all watched users) is not repeated per user")
    b.drop_db(dbname)
    b.drop_db(ticks_db)
