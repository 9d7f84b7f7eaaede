"""Admission latency on `sftq dev`'s stack (issue 53): how long a job waits for admission
when there is room, and how long a freed slot stays empty, with event-driven admission on
and, in the same run, off.

Each mode runs its own `sftq dev` (the simulator, the gateway and the ticker at the default
30 s interval) on a fresh database of the bench's cluster; "off" is SFTQ_EVENT_ADMISSION=off
with SFTQ_RECONCILE_FRESHNESS_SECONDS=0, the periodic tick alone, as before issue 53.

- submit to PROGRESS with room: jobs of 1 GPU (room for all), each from its own user, arrive
  at random (exponential gaps, 0.5 s on average), each timed from the start of its POST
  /jobs to its started_at, the admission's commit (read from the database afterwards, so
  nothing polls the API while it runs);
- cancel to the next user's PROGRESS: the provider has room for one 4-GPU job; one user's
  job runs, another's waits (submitted 1.5 s earlier, so the wake its submit caused is
  spent), the running one is cancelled (DELETE /jobs/{id}) and the waiting one's started_at
  is timed from the start of the DELETE. The two users take turns.

The off case waits for the periodic tick (about 15 s on average), so it measures fewer jobs;
the quick mode (`--quick`) measures a few jobs and runs the ticker every 6 s instead of 30,
and says so in each row.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
from common import FUNCTIONS, Bench, percentile

from sftq_server.dev.pgcluster import free_port

SECTION = "admission_latency"
PAYLOAD = {"baseModel": "accounts/fireworks/models/qwen3-14b", "dataset": "accounts/b/datasets/d"}
GOAL_S = 2.0


@dataclass
class Sizes:
    interval: float  # the ticker's period
    submit_on: int
    submit_off: int
    cancel_on: int
    cancel_off: int
    mean_gap: float  # mean seconds between submits


FULL = Sizes(interval=30.0, submit_on=60, submit_off=20, cancel_on=20, cancel_off=6, mean_gap=0.5)
QUICK = Sizes(interval=6.0, submit_on=8, submit_off=4, cancel_on=3, cancel_off=2, mean_gap=0.5)


class Stack:
    """One `sftq dev` on a database of the bench's cluster, stopped by close()."""

    def __init__(self, b: Bench, dbname: str, interval: float, env: dict[str, str]) -> None:
        self.db_url = b.new_db(dbname)
        self.dbname = dbname
        self.port, sim_port = free_port(), free_port()
        data_dir = b.out_dir / f"{dbname}-data"
        child_env = {k: v for k, v in os.environ.items()
                     if not k.startswith(("SFTQ_", "FIREWORKS_", "DATABASE_URL", "SUPABASE_"))}
        child_env |= {"PYTHONPATH": str(FUNCTIONS), "PYTHONUNBUFFERED": "1",
                      "DATABASE_URL": self.db_url} | env
        self.log = open(b.out_dir / f"{dbname}.log", "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sftq_server.cli.dev", "dev", "--data-dir", str(data_dir),
             "--port", str(self.port), "--simulator-port", str(sim_port),
             "--tick-interval", f"{interval:g}", "--simulator-job-seconds", "0"],
            env=child_env, stdout=subprocess.PIPE, stderr=self.log, text=True,
            start_new_session=True)
        self.values: dict[str, str] = {}
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 120
        for line in self.proc.stdout:
            line = line.strip()
            if "=" in line:
                key, _, value = line.partition("=")
                self.values[key] = value
            if line == "ready" or time.monotonic() > deadline:
                break
        if "SUPABASE_URL" not in self.values:
            self.close()
            raise RuntimeError(f"sftq dev did not start; see {self.log.name}")
        self.api = f"{self.values['SUPABASE_URL']}/functions/v1/jobs-api"
        self.http = httpx.Client(timeout=30.0)

    def sql(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def keys(self, names: list[str], cap: int) -> list[str]:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            out = []
            for name in names:
                conn.execute("SELECT sftq.create_user(%s, %s)", (name, cap))
                row = conn.execute("SELECT key FROM sftq.issue_key(%s)", (name,)).fetchone()
                assert row is not None
                out.append(str(row[0]))
        return out

    def quota(self, value: int) -> None:
        r = self.http.post(f"{self.values['SIMULATOR_URL']}/_sim/quota",
                           json={"maxValue": max(value, 64), "value": value})
        r.raise_for_status()

    def submit(self, key: str, gpus: int) -> tuple[str, float]:
        t0 = time.time()
        r = self.http.post(f"{self.api}/jobs", headers={"Authorization": f"Bearer {key}"},
                           json={"kind": "SFT", "gpu_count": gpus, "validate": "off",
                                 "fireworks_payload": PAYLOAD})
        r.raise_for_status()
        return str(r.json()["id"]), t0

    def cancel(self, key: str, job: str) -> float:
        t0 = time.time()
        r = self.http.delete(f"{self.api}/jobs/{job}", headers={"Authorization": f"Bearer {key}"})
        r.raise_for_status()
        return t0

    def started(self, jobs: list[str]) -> dict[str, float]:
        rows = self.sql("SELECT id::text, extract(epoch FROM started_at)::float8 FROM sftq.jobs "
                        "WHERE id::text = ANY(%s) AND started_at IS NOT NULL", (jobs,))
        return {r[0]: float(r[1]) for r in rows}

    def wait_started(self, jobs: list[str], timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        seen = self.started(jobs)
        while len(seen) < len(jobs) and time.monotonic() < deadline:
            time.sleep(0.25)
            seen = self.started(jobs)
        return seen

    def after_first_tick(self) -> None:
        deadline = time.monotonic() + 60
        while not self.sql("SELECT 1 FROM sftq.scheduler_ticks WHERE finished_at IS NOT NULL"):
            if time.monotonic() > deadline:
                raise RuntimeError("the ticker's first tick never came")
            time.sleep(0.2)

    def ticks(self) -> int:
        return int(self.sql("SELECT count(*) FROM sftq.scheduler_ticks")[0][0])

    def close(self) -> None:
        with contextlib.suppress(AttributeError):
            self.http.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


def measure_submits(stack: Stack, n: int, mean_gap: float, timeout: float) -> list[float]:
    """Seconds from each POST /jobs to the job's admission (room for all). Each job is its
    own user's: a pass admits one job per user (docs/scheduling.md), so one user's burst
    would measure the fairness rule, not the wake-up."""
    stack.quota(max(64, n + 8))
    keys = stack.keys([f"submitter{i}" for i in range(n)], cap=1)
    rng = random.Random(53)
    sent: dict[str, float] = {}
    for key in keys:
        time.sleep(rng.expovariate(1.0 / mean_gap))
        job, t0 = stack.submit(key, gpus=1)
        sent[job] = t0
    started = stack.wait_started(list(sent), timeout)
    return [started[j] - t0 for j, t0 in sent.items() if j in started] + \
        [float("inf")] * (n - len(started))


def measure_cancels(stack: Stack, n: int, timeout: float) -> list[float]:
    """Seconds from the DELETE of the running job to the waiting user's job's admission."""
    stack.quota(4)
    keys = stack.keys(["ann", "bob"], cap=1)
    running, t0 = stack.submit(keys[0], gpus=4)
    if running not in stack.wait_started([running], timeout):
        raise RuntimeError("the first job was never admitted")
    out: list[float] = []
    for i in range(n):
        owner, other = keys[i % 2], keys[(i + 1) % 2]
        waiting, _ = stack.submit(other, gpus=4)
        time.sleep(1.5)  # its own wake is spent: it waits for room
        t0 = stack.cancel(owner, running)
        started = stack.wait_started([waiting], timeout)
        if waiting not in started:
            out.append(float("inf"))
            break
        out.append(started[waiting] - t0)
        running = waiting
    return out


def _summary(values: list[float]) -> dict[str, Any]:
    finite = sorted(v for v in values if v != float("inf"))
    return {"n": len(values), "admitted": len(finite),
            "p50_s": round(percentile(finite, 50), 3) if finite else None,
            "p95_s": round(percentile(finite, 95), 3) if finite else None,
            "max_s": round(finite[-1], 3) if finite else None}


def run_mode(b: Bench, sizes: Sizes, on: bool) -> dict[str, Any]:
    env = {} if on else {"SFTQ_EVENT_ADMISSION": "off", "SFTQ_RECONCILE_FRESHNESS_SECONDS": "0"}
    name = "on" if on else "off"
    stack = Stack(b, f"bench_admission_latency_{name}", sizes.interval, env)
    try:
        stack.after_first_tick()
        ticks0 = stack.ticks()
        wait = 3 * sizes.interval
        cancels = measure_cancels(stack, sizes.cancel_on if on else sizes.cancel_off, wait)
        submits = measure_submits(stack, sizes.submit_on if on else sizes.submit_off,
                                  sizes.mean_gap, wait)
        return {"submit": _summary(submits), "cancel": _summary(cancels),
                "ticks": stack.ticks() - ticks0, "raw_submit_s": submits, "raw_cancel_s": cancels}
    finally:
        stack.close()
        b.drop_db(stack.dbname)


def run(b: Bench) -> None:
    sizes = QUICK if b.quick else FULL
    results = {"interval_s": sizes.interval, "on": run_mode(b, sizes, True),
               "off": run_mode(b, sizes, False)}
    b.data[SECTION] = results
    ticker = f"ticker every {sizes.interval:g} s" + (" (quick mode)" if b.quick else "")
    for case, what in (("submit", "submit to PROGRESS with room"),
                       ("cancel", "cancel to next user's PROGRESS")):
        on, off = results["on"][case], results["off"][case]
        all_in = on["admitted"] == on["n"]
        b.add(SECTION, f"{what}, p95, event admission on", on["p95_s"], "s",
              goal="< 2 s", ok=all_in and on["p95_s"] is not None and on["p95_s"] < GOAL_S,
              note=f"p50 {on['p50_s']} s, max {on['max_s']} s, {on['admitted']}/{on['n']} "
              f"jobs; {ticker}")
        b.add(SECTION, f"{what}, p50, event admission on", on["p50_s"], "s")
        b.add(SECTION, f"{what}, p50, off (periodic tick only)", off["p50_s"], "s",
              note=f"p95 {off['p95_s']} s, {off['admitted']}/{off['n']} jobs (fewer: each "
              f"waits for the periodic tick); {ticker}")
    b.add(SECTION, "ticks during the on run (periodic, woken, reconcile)",
          results["on"]["ticks"], "ticks",
          note=f"off run: {results['off']['ticks']}")
