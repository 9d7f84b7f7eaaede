"""The load scenario, shared by the load test and by the break-on-purpose tests (which run
it briefly against a deliberately broken database and expect the checks to object)."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rel_support import (
    ACCOUNT,
    FW_KEY,
    ClientStats,
    FaultySim,
    budget_violations,
    cap_violations,
    connect,
    counts,
    created_once_violations,
    fifo_violations,
    finisher,
    gpu_violations,
    install_budget_oracle,
    install_fifo_oracle,
    join_all,
    lost_violations,
    make_users,
    oracle_violations,
    provider_quota_violations,
    rel_settings,
    run_clients,
    set_true_external,
    transition_violations,
)

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.provider import FireworksClient
from sftq_server.scheduler.tick import run_tick


@dataclass
class LoadParams:
    seconds: float = 20.0
    clients: int = 32
    tickers: int = 4
    users: int = 12
    max_requests: int = 100_000
    job_seconds: float = 1.0
    quota: int = 24
    seed: int = 1
    # Seconds before the provider's usage counts a new job (Fireworks' usage lags).
    usage_lag: float = 0.0
    # External usage (GPUs used outside the queue) moves among these values, up and down,
    # between ticks; empty: none.
    external: tuple[int, ...] = ()


@dataclass
class TickStats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    outcomes: Counter[str] = field(default_factory=Counter)
    checks: int = 0
    problems: list[str] = field(default_factory=list)
    # Violations seen by the checks run after each tick, by check.
    violations: dict[str, list[str]] = field(default_factory=dict)

    def add(self, result: dict[str, Any]) -> None:
        with self.lock:
            self.outcomes[result["status"]] += 1
            if any("lease lost" in e for e in result.get("errors") or []):
                self.outcomes["lease_lost"] += 1

    def saw(self, found: dict[str, list[str]]) -> None:
        with self.lock:
            self.checks += 1
            for name, items in found.items():
                if items:
                    self.violations.setdefault(name, []).extend(items)


class TickGate:
    """Ticks run inside `tick()`, any number at once; `between_ticks(change)` waits until no
    tick runs, holds new ones back, and makes its change then. So the provider's external
    usage stays what a tick read from its quota reading to its last create, and the budget
    oracle knows the true external usage at each admission."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._changing = False

    @contextlib.contextmanager
    def tick(self) -> Iterator[None]:
        with self._cond:
            while self._changing:
                self._cond.wait()
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def between_ticks(self, change: Callable[[], None]) -> None:
        with self._cond:
            self._changing = True  # no tick starts from here on
            while self._running:
                self._cond.wait()
        try:
            change()
        finally:
            with self._cond:
                self._changing = False
                self._cond.notify_all()


def external_mover(sim: FaultySim, gate: TickGate, db_url: str, values: tuple[int, ...],
                   stop: threading.Event, deadline: float, rng: random.Random,
                   moves: Counter[str]) -> None:
    """Moves the simulator's external usage to another of `values` every 0.1 to 0.4 s,
    between ticks, and tells the budget oracle the true value each time."""
    current = 0
    with connect(db_url) as conn:
        rounds = 0
        while not stop.is_set() and time.monotonic() < deadline and rounds < 100_000:
            rounds += 1
            stop.wait(rng.uniform(0.1, 0.4))
            new = rng.choice([v for v in values if v != current] or [current])

            def change(new: int = new) -> None:
                sim.set_quota(external_usage=new)
                set_true_external(conn, new)

            gate.between_ticks(change)
            moves["up" if new > current else "down" if new < current else "same"] += 1
            current = new


@dataclass
class LoadResult:
    clients: ClientStats
    ticks: TickStats
    final: dict[str, list[str]]
    figures: dict[str, Any]

    def all_violations(self) -> dict[str, list[str]]:
        merged = {f"{k} (after a tick)": v for k, v in self.ticks.violations.items()}
        merged.update({f"{k} (at the end)": v for k, v in self.final.items() if v})
        return merged


def check_between_ticks(conn: Any, sim: FaultySim, quota: int,
                        since: int) -> tuple[dict[str, list[str]], int]:
    """The invariants that hold between any two ticks; the event-log FIFO check runs over the
    admissions after `since` (the last one it checked)."""
    held = sim.running_gpus()
    fifo, since = fifo_violations(conn, since)
    return {
        "cap": cap_violations(conn),
        "gpus": gpu_violations(conn, quota)
        + ([f"the provider holds {held} GPUs of ours, quota {quota}"] if held > quota else []),
        "gpus at admission (in-transaction)": budget_violations(conn),
        "gpus at the provider": provider_quota_violations(sim),
        "fifo (event log)": fifo,
        "fifo (in-transaction)": oracle_violations(conn),
        "created once": created_once_violations(conn, sim, final=False),
    }, since


def _tick_worker(i: int, db: Database, settings: Settings, sim: FaultySim, sim_url: str,
                 db_url: str, quota: int, deadline: float, stop: threading.Event,
                 stats: TickStats, rng: random.Random, gate: TickGate,
                 max_ticks: int = 100_000) -> None:
    since = 0
    with FireworksClient(base_url=sim_url, api_key=FW_KEY, account_id=ACCOUNT,
                         timeout=5.0) as provider, connect(db_url) as conn:
        n = 0
        while n < max_ticks and time.monotonic() < deadline and not stop.is_set():
            n += 1
            try:
                with gate.tick():
                    result = run_tick(db, provider, settings, holder=f"load-{i}")
            except Exception as exc:  # noqa: BLE001 - reported by the test, not lost in a thread
                with stats.lock:
                    stats.problems.append(f"tick {i}: {type(exc).__name__}: {exc}")
                continue
            stats.add(result)
            if result["status"] == "error":
                with stats.lock:
                    stats.problems.extend(f"tick {i}: {e}" for e in result["errors"]
                                          if "lease lost" not in e)
            found, since = check_between_ticks(conn, sim, quota, since)
            stats.saw(found)
            stop.wait(rng.uniform(0.0, 0.03))


def run_load(db_url: str, make_sim: Any, make_gateway: Any, p: LoadParams) -> LoadResult:
    """Clients through the served gateway, concurrent in-process ticks, provider jobs ending
    at random; checks after every tick and at the end."""
    rng = random.Random(p.seed)
    sim, sim_server = make_sim(job_seconds=p.job_seconds, max_value=p.quota)
    if p.usage_lag:
        sim.set_quota(usage_lag_seconds=p.usage_lag)
    gate = TickGate()
    settings = rel_settings(db_url, sim_server.url, tick_lease_seconds=1.0)
    # Every other ticker takes a lease far shorter than its tick: the next ticker takes over
    # while it still runs, so ticks really overlap (admitting and creating side by side, as
    # after a lease expiry under a slow tick) instead of mostly skipping. The admission gate
    # and the derived provider ids must make that harmless.
    overlapping = dataclasses.replace(settings, tick_lease_seconds=0.05)
    gateway = make_gateway(settings)
    with connect(db_url) as conn:
        install_fifo_oracle(conn)
        install_budget_oracle(conn, p.quota)
        users = make_users(conn, p.users, keys_per_user=2, caps={0: 2, 1: 2})

    db = Database(db_url, max_size=8, timeout=5.0)
    stop = threading.Event()
    tick_stats = TickStats()
    finished: Counter[str] = Counter()
    moves: Counter[str] = Counter()
    started = time.monotonic()
    deadline = started + p.seconds
    try:
        client_stats, clients = run_clients(gateway.jobs_url, users, p.clients, p.seconds,
                                            p.max_requests, p.seed)
        tickers = [threading.Thread(target=_tick_worker, name=f"rel-tick-{i}",
                                    args=(i, db, overlapping if i % 2 else settings, sim,
                                          sim_server.url, db_url, p.quota,
                                          deadline, stop, tick_stats,
                                          random.Random(rng.random()), gate))
                   for i in range(p.tickers)]
        fin = threading.Thread(target=finisher, name="rel-finisher",
                               args=(sim, stop, deadline, random.Random(rng.random()), finished))
        helpers = [fin]
        if p.external:
            helpers.append(threading.Thread(
                target=external_mover, name="rel-external",
                args=(sim, gate, db_url, p.external, stop, deadline,
                      random.Random(rng.random()), moves)))
        for t in (*tickers, *helpers):
            t.start()
        alive = join_all(clients, p.seconds + 60)
        stop.set()
        alive += join_all([*tickers, *helpers], 60)
        assert not alive, f"threads still running: {alive}"
    finally:
        stop.set()
        db.close()
    elapsed = time.monotonic() - started

    with connect(db_url) as conn:
        final = {
            "cap": cap_violations(conn),
            "gpus": gpu_violations(conn, p.quota),
            "gpus at admission (in-transaction)": budget_violations(conn),
            "gpus at the provider": provider_quota_violations(sim),
            "fifo (event log)": fifo_violations(conn, 0)[0],
            "fifo (in-transaction)": oracle_violations(conn),
            "created once": created_once_violations(conn, sim, final=True),
            "nothing lost": lost_violations(conn, client_stats.accepted),
            "legal transitions": transition_violations(conn),
        }
        admitted = counts(conn, "SELECT count(*) FROM sftq.job_events WHERE event = 'admitted'")
        by_state = dict(conn.execute("SELECT state, count(*) FROM sftq.jobs GROUP BY 1")
                        .fetchall())
    figures = {
        "seconds": round(elapsed, 1), "client_threads": p.clients, "tick_threads": p.tickers,
        "users": p.users, "quota_gpus": p.quota,
        "http_requests": client_stats.requests, "http_by_kind": dict(client_stats.sent),
        "http_per_second": round(client_stats.requests / elapsed),
        "accepted_posts": len(client_stats.accepted), "jobs_by_state": by_state,
        "ticks": dict(tick_stats.outcomes), "checks_after_ticks": tick_stats.checks,
        "admissions": admitted, "provider_requests": len(sim.requests()),
        "provider_creates_ok": sum(sim.created_ok().values()),
        "provider_creates_409": sum(1 for a in sim.snapshot()
                                    if a.op == "create" and a.status == 409),
        "finished_at_random": sum(finished.values()),
        "external_usage_moves": dict(moves),
        "provider_over_quota_creates": sim.quota()["over_quota_creates"],
    }
    return LoadResult(client_stats, tick_stats, final, figures)
