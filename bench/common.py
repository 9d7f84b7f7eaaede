"""Shared pieces of the benchmark: the private cluster, databases, timing, CPU accounting
and the result table. Every section module gets one `Bench` object."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
FUNCTIONS = ROOT / "functions"
if str(FUNCTIONS) not in sys.path:
    sys.path.insert(0, str(FUNCTIONS))

import psycopg  # noqa: E402

from sftq_server.db import migrate as migrate  # noqa: E402
from sftq_server.dev.pgcluster import LocalCluster, find_bindir  # noqa: E402

# PostgreSQL settings: sized like a small production instance on this 2-core, 24 GB box.
# fsync and full_page_writes stay ON (crash-safe storage). synchronous_commit is OFF
# cluster-wide: a commit returns once its WAL is written, and the WAL writer flushes it
# within wal_writer_delay (a crash can lose the last ~0.2 s of acknowledged commits, never
# corrupt anything). This machine's virtual disk takes 0.5-4 ms per fdatasync and varies a
# lot from run to run, which would make the enqueue comparison measure the disk rather than
# the code; the enqueue section adds rows with synchronous_commit=on per connection so the
# durable figure is in the table too. jit is off (OLTP latency: compiling a plan costs more
# than it saves on these queries).
PG_SETTINGS: dict[str, str] = {
    "max_connections": "200",
    "shared_buffers": "1GB",
    "effective_cache_size": "4GB",
    "work_mem": "16MB",
    "maintenance_work_mem": "512MB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
    "random_page_cost": "1.1",
    "effective_io_concurrency": "200",
    "jit": "off",
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_commit": "off",
    "track_io_timing": "on",
    "log_min_messages": "warning",
}

TEMPLATE = "sftq_bench_template"


def conninfo_kwargs() -> dict[str, Any]:
    """What every function connection uses (transaction-mode pooler rules)."""
    return {"autocommit": True, "prepare_threshold": None}


@dataclass
class Row:
    section: str
    name: str
    value: float | None
    unit: str
    goal: str = ""
    ok: bool | None = None
    note: str = ""
    # False for an HTTP figure measured without wrk: printed as n/c, neither ok nor MISSED.
    comparable: bool = True


@dataclass
class Bench:
    quick: bool
    out_dir: Path
    cluster: LocalCluster | None = None
    rows: list[Row] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _dbs: list[str] = field(default_factory=list)

    # -- cluster ---------------------------------------------------------------------------

    def start_cluster(self) -> None:
        data_dir = tempfile.mkdtemp(prefix="sftq-bench-pg-", dir="/tmp")
        self.cluster = LocalCluster(data_dir, bindir=find_bindir(), settings=dict(PG_SETTINGS))
        self.cluster.start()
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
        migrate.migrate(self.url(TEMPLATE))
        with psycopg.connect(self.url(TEMPLATE), autocommit=True) as conn:
            # The per-user limits stay on (every request still takes its user's bucket, as in
            # production) but never refuse the bench's own load, which sends one user's
            # requests far faster than a person would; the enqueue_cost section measures what
            # the limiter costs.
            conn.execute("UPDATE sftq.user_limit_defaults "
                         "SET rate_per_minute = 1000000, max_streams = 0")
            conn.execute("VACUUM ANALYZE")

    def stop_cluster(self) -> None:
        if self.cluster is not None:
            self.cluster.destroy()
            self.cluster = None

    def url(self, dbname: str, **options: str) -> str:
        assert self.cluster is not None
        base: str = self.cluster.url_for(dbname)
        if options:
            opts = " ".join(f"-c {k}={v}" for k, v in options.items())
            base += "?options=" + opts.replace(" ", "%20").replace("=", "%3D")
        return base

    @contextmanager
    def admin(self) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            yield conn

    def new_db(self, name: str, *, migrated: bool = True) -> str:
        """A fresh database: a clone of the migrated template, or empty."""
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            if migrated:
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
            else:
                conn.execute(f'CREATE DATABASE "{name}"')
        self._dbs.append(name)
        return self.url(name)

    def drop_db(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def postmaster_pid(self) -> int:
        assert self.cluster is not None
        return int((self.cluster.pgdata / "postmaster.pid").read_text().split()[0])

    def server_version(self) -> str:
        with self.admin() as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"

    # -- results ---------------------------------------------------------------------------

    def add(self, section: str, name: str, value: float | None, unit: str, *,
            goal: str = "", ok: bool | None = None, note: str = "") -> None:
        self.rows.append(Row(section, name, value, unit, goal, ok, note))
        flag = "" if ok is None else (" ok" if ok else " MISSED")
        shown = "-" if value is None else _fmt(value)
        print(f"  [{section}] {name}: {shown} {unit}{flag}"
              + (f"  ({note})" if note else ""), flush=True)

    def log(self, text: str) -> None:
        print(f"  {text}", flush=True)


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def machine_info() -> dict[str, Any]:
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "mem_gib": round(mem_kb / 1024 / 1024, 1), "cpu": cpu,
            "python": platform.python_version(), "kernel": platform.release()}


# -- timing -------------------------------------------------------------------------------

def percentile(values: list[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100) of an unsorted list."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def time_calls(fn: Callable[[], Any], *, reps: int, warmup: int = 3) -> list[float]:
    """Wall times in ms of `reps` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    out: list[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def query(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Callable[[], Any]:
    """A no-argument callable that runs `sql` and fetches every row (for time_calls)."""

    def call() -> Any:
        return conn.execute(sql, params).fetchall()

    return call


def summarize(ms: list[float]) -> dict[str, float]:
    return {"n": len(ms), "p50": percentile(ms, 50), "p95": percentile(ms, 95),
            "p99": percentile(ms, 99), "mean": statistics.fmean(ms) if ms else float("nan"),
            "min": min(ms) if ms else float("nan")}


# -- CPU accounting from /proc ------------------------------------------------------------

_CLK = os.sysconf("SC_CLK_TCK")


def _proc_stat_cpu() -> list[int]:
    """The machine-wide `cpu` line of /proc/stat, in clock ticks: user, nice, system, idle,
    iowait, irq, softirq, steal, ..."""
    return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]


def proc_cpu_seconds(pid: int) -> float:
    """CPU time of one process (its live threads), in seconds; 0 if it is gone.

    From /proc/<pid>/task/*/schedstat (nanoseconds) where the kernel has it: /proc/<pid>/stat
    counts in clock ticks (10 ms), too coarse for sub-millisecond costs per request over a few
    hundred processes' worth of rounding.
    """
    try:
        total = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK


def children(pid: int) -> list[int]:
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def tree(pid: int) -> list[int]:
    pids = [pid]
    for child in children(pid):
        pids += tree(child)
    return pids


class CpuMeter:
    """CPU seconds used by named process trees between start() and stop()."""

    def __init__(self, roots: dict[str, Callable[[], list[int]]]) -> None:
        self.roots = roots
        self._start: dict[str, dict[int, float]] = {}
        self.used: dict[str, float] = {}
        self._sys0 = 0.0
        self.total_busy = 0.0

    @staticmethod
    def _system_busy() -> float:
        vals = _proc_stat_cpu()
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return (sum(vals[:8]) - idle) / _CLK

    def start(self) -> None:
        self._sys0 = self._system_busy()
        for name, pids in self.roots.items():
            self._start[name] = {p: proc_cpu_seconds(p) for p in pids()}

    def stop(self) -> dict[str, float]:
        self.total_busy = self._system_busy() - self._sys0
        for name, pids in self.roots.items():
            before = self._start.get(name, {})
            self.used[name] = sum(max(0.0, proc_cpu_seconds(p) - before.get(p, 0.0))
                                  for p in pids())
        self.used["machine"] = self.total_busy
        return self.used


def steal_seconds() -> float:
    """CPU seconds the hypervisor gave other guests instead of this machine since boot (the
    steal column of /proc/stat, summed over CPUs): time a virtual machine's measurement lost
    without any process here using it. 0 where the kernel does not report it."""
    vals = _proc_stat_cpu()
    return vals[7] / _CLK if len(vals) > 7 else 0.0


def steal_mark() -> tuple[float, float]:
    """Where a steal_share() measurement starts: the steal so far and the time."""
    return steal_seconds(), time.monotonic()


def steal_share(mark: tuple[float, float]) -> float:
    """The share of the machine's CPU the hypervisor took since `mark` (steal_mark())."""
    stolen, t0 = mark
    elapsed = time.monotonic() - t0
    return (steal_seconds() - stolen) / max(elapsed * (os.cpu_count() or 1), 1e-9)


def speed_probe(rounds: int = 3) -> float:
    """Milliseconds a fixed single-threaded CPU loop takes here now (the best of `rounds`).

    A virtual machine's speed drifts with its neighbours by more than steal time shows (a
    section with no steal ran 2-3x slower than the same code days before): the run takes this
    probe around every section so a table says when the machine itself changed under it.
    """
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        acc = 0
        for i in range(500_000):
            acc += i * i % 7
        best = min(best, time.perf_counter() - t0)
    return best * 1000


# The database probe's statement: a hash aggregation of 300,000 rows into 150,000 groups,
# whose table and input (about 10 MB) are larger than a core's own caches. It runs at the
# speed of the last-level cache and memory, which other guests of the host share: on
# 2026-12-04 the database sections ran 1.4-2.5x slower than days before while the CPU loop of
# speed_probe(), which stays in a core's own caches, read as fast as ever.
DB_PROBE_SQL = ("SELECT count(*) FROM (SELECT g % 150000 FROM generate_series(1, 300000) g "
                "GROUP BY 1) s")


def db_probe(url: str, rounds: int = 3) -> float:
    """Milliseconds the database probe (DB_PROBE_SQL) takes in the cluster at `url` now (the
    best of `rounds`): what speed_probe() is for the CPU, for work whose data does not fit in
    a core's own caches."""
    best = math.inf
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(rounds):
            t0 = time.perf_counter()
            conn.execute(DB_PROBE_SQL).fetchone()
            best = min(best, time.perf_counter() - t0)
    return best * 1000


def background_cores(seconds: float = 2.0) -> float:
    """Cores' worth of CPU the machine is busy with right now (before the bench loads it)."""
    meter = CpuMeter({})
    meter.start()
    time.sleep(seconds)
    meter.stop()
    return meter.total_busy / seconds


def vm_hwm_kib(pid: int) -> int:
    """Peak resident set size (VmHWM) of a process, in KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# -- subprocesses ---------------------------------------------------------------------------

def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL: every process the bench starts goes through here."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
