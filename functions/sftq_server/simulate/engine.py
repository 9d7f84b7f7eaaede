"""The replay: a trace's jobs through the real SQL admission and tick, on a virtual clock.

What runs is production's own code: users submit through `sftq.api_submit_many` (what
POST /jobs' group commit calls) or `sftq.api_submit_job` (a job with `after`), cancel through
`sftq.api_cancel_job` and the provider stop jobs-api makes, and `run_tick` runs every phase
against the Fireworks simulator (in process, through httpx's WSGI transport). Only time is
virtual: the database reads it from `sftq_sim.clock` (simulate.clock), the simulator from the
replay's clock, and the replay jumps from one event to the next without sleeping.

The events: a trace job's submit, its end at the provider (`run_seconds` after the tick
created it there; the simulator is told to finish it), a user's cancel, a change of the GPUs
used outside the queue, and the passes the scheduler makes: the periodic tick every
`tick_interval`, a woken tick after the queue's own events (`event_admission`, as
`sftq ticker` fires them: when the wake flag is set, at least `early_tick_gap` after the
last tick started) and a reconcile pass while jobs run (at `reconcile_interval`). A periodic
tick or reconcile pass that could change nothing (no event since the last pass, which ended
clean) is skipped: it would read the same rows and admit nothing. Its time still counts as
the last tick's start for the woken ticks' gap, as it would in production.

Rate limits (FIREWORKS_RPM pacing, a 429's Retry-After) are real-time mechanisms of the
provider client; a replay runs at thousands of times real time, so it lifts the pacing and
lets a Retry-After last until the next pass.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import json
import math
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import httpx
import psycopg

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.db import migrate as migrations
from sftq_server.provider import FireworksClient
from sftq_server.provider.names import provider_job_id
from sftq_server.scheduler import wake
from sftq_server.scheduler.tick import run_tick
from sftq_server.simulate import clock, invariants
from sftq_server.simulator import COLLECTIONS, Simulator

ACCOUNT = "sim-account"
API_KEY = "replay-provider-key"
BASE_URL = "http://simulator.replay"
# The ticker reads the wake flag this often (sftq_server.scheduler.wake.POLL_SECONDS).
POLL = wake.POLL_SECONDS
# A replay that still has unfinished jobs this long after its last event has a job that can
# never run (more GPUs than the quota, say): it stops and says which.
IDLE_LIMIT_SECONDS = 7 * 86400.0


# -- what a trace looks like to the engine (sftq_server.simulate.trace has the real ones) ----

class JobLike(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def submit_at(self) -> float: ...
    @property
    def user(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def gpu_count(self) -> int: ...
    @property
    def run_seconds(self) -> float: ...
    @property
    def outcome(self) -> str: ...
    @property
    def outcome_at(self) -> float | None: ...
    @property
    def after(self) -> tuple[str, ...]: ...


class ExternalLike(Protocol):
    @property
    def at(self) -> float: ...
    @property
    def gpus(self) -> int: ...


class TraceLike(Protocol):
    @property
    def jobs(self) -> Sequence[JobLike]: ...
    @property
    def external(self) -> Sequence[ExternalLike]: ...


# -- settings --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Options:
    """One replay's settings (`sftq simulate --cap ... --quota ...`)."""

    cap: int = 1                                    # every user's cap (max_running)
    caps: dict[str, int] = field(default_factory=dict)  # per-user caps over `cap`
    quota: int = 8                                  # the account's GPU quota
    tick_interval: float = 30.0                     # seconds between periodic ticks
    event_admission: bool = True                    # woken ticks and reconcile passes
    max_queued: int | None = None                   # per-user limit (needs the limits SQL)
    wait_threshold: float = 3600.0                  # seconds; "jobs over the threshold"
    faults: dict[str, Any] | None = None            # Simulator.set_faults keyword arguments
    seed: int = 1

    def cap_of(self, user: str) -> int:
        return self.caps.get(user, self.cap)

    def as_json(self) -> dict[str, Any]:
        return {"cap": self.cap, "caps": dict(self.caps), "quota": self.quota,
                "tick_interval": self.tick_interval, "event_admission": self.event_admission,
                "limits": {"max_queued": self.max_queued},
                "wait_threshold": self.wait_threshold, "faults": self.faults}


OPTION_KEYS = ("cap", "quota", "tick-interval", "event-admission", "max-queued",
               "wait-threshold")


def with_overrides(base: Options, spec: str) -> Options:
    """`base` with a --compare side applied: comma-separated key=value pairs, keys as the
    flags are spelled (cap, quota, tick-interval, event-admission, max-queued,
    wait-threshold); `cap=alice:3` sets one user's cap. ValueError says what to fix."""
    changes: dict[str, Any] = {}
    caps = dict(base.caps)
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip().lstrip("-").replace("_", "-")
        value = value.strip()
        if not sep or key not in OPTION_KEYS or not value:
            raise ValueError(f"--compare side {spec!r}: {part!r} is not key=value with a key "
                             f"of {', '.join(OPTION_KEYS)} (e.g. \"cap=2,quota=16\")")
        try:
            if key == "cap":
                user, colon, n = value.rpartition(":")
                if colon:
                    caps[user] = int(n)
                else:
                    changes["cap"] = int(value)
            elif key == "quota":
                changes["quota"] = int(value)
            elif key == "tick-interval":
                changes["tick_interval"] = float(value)
            elif key == "wait-threshold":
                changes["wait_threshold"] = float(value)
            elif key == "max-queued":
                changes["max_queued"] = int(value)
            else:
                if value.lower() not in ("on", "off", "true", "false"):
                    raise ValueError(value)
                changes["event_admission"] = value.lower() in ("on", "true")
        except ValueError:
            raise ValueError(f"--compare side {spec!r}: {key} cannot be {value!r}") from None
    changes["caps"] = caps
    return Options(**{**asdict(base), **changes})


class ReplayError(Exception):
    """The replay could not run (no PostgreSQL, a setting the database cannot apply)."""


# -- the provider, in process ----------------------------------------------------------------

class CountingSim:
    """The simulator as a WSGI app that also counts each provider id's successful creates
    (the simulator records requests, not answers; "nothing submitted twice" needs answers)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.created: Counter[str] = Counter()
        self.twice: list[str] = []

    def __call__(self, environ: Any, start_response: Any) -> Any:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        path = str(environ.get("PATH_INFO", ""))
        query = str(environ.get("QUERY_STRING", ""))
        status: list[int] = []

        def capture(line: str, headers: Any, exc_info: Any = None) -> Any:
            status.append(int(line.split(" ", 1)[0]))
            return start_response(line, headers, exc_info)

        body = self.sim(environ, capture)
        if method == "POST" and status and 200 <= status[0] < 300 and ":" not in path:
            for part in query.split("&"):
                name, _, value = part.partition("=")
                if name.endswith("JobId") and value:
                    self.created[value] += 1
                    if self.created[value] == 2:
                        self.twice.append(value)
        return body


def payload(kind: str) -> dict[str, Any]:
    """A create body the simulator accepts, for a job of `kind`."""
    body: dict[str, Any] = {"dataset": "accounts/replay/datasets/trace"}
    if kind == "SFT":
        body["baseModel"] = "accounts/fireworks/models/qwen3-8b"
    elif kind == "DPO":
        body["trainingConfig"] = {"baseModel": "accounts/fireworks/models/qwen3-8b"}
    else:
        body["evaluator"] = "accounts/replay/evaluators/e"
        body["inferenceParameters"] = {"responseCandidatesCount": 4}
    return body


# -- a database to throw away ----------------------------------------------------------------

@contextlib.contextmanager
def throwaway_database() -> Iterator[str]:
    """A fresh PostgreSQL cluster (the one `sftq dev` finds) in a temporary folder, with one
    empty database; destroyed afterwards."""
    from sftq_server.dev.pgcluster import ClusterError, LocalCluster, find_bindir

    try:
        bindir = find_bindir()
    except ClusterError as exc:
        raise ReplayError(f"no PostgreSQL to replay on: {exc}") from exc
    folder = tempfile.mkdtemp(prefix="sftq-replay-pg-")
    cluster = LocalCluster(folder, bindir=bindir, settings={
        "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
        "shared_buffers": "128MB", "max_connections": "20"})
    cluster.start()
    try:
        with psycopg.connect(cluster.url_for("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE replay")
        # Its own Unix socket: a little faster than loopback TCP, and the replay makes
        # tens of thousands of round trips.
        yield cluster.socket_conninfo("replay")
    finally:
        cluster.destroy()


# -- the replay ------------------------------------------------------------------------------

class Violation(Exception):
    """An invariant broke: the replay stopped at this tick."""

    def __init__(self, tick: int, at: float, problems: list[tuple[str, list[str]]]) -> None:
        self.tick = tick
        self.at = at
        self.problems = problems
        first = problems[0][0] if problems else "?"
        super().__init__(f"tick {tick} at virtual {at:.0f} s: {first}")


@dataclass
class _Job:
    trace: JobLike
    queue_id: str | None = None
    started: float | None = None     # created at the provider (virtual seconds)
    ended: float | None = None       # ended at the provider
    provider_done: bool = False
    refused: str | None = None       # refused at submit (a per-user limit, say)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Replay:
    """One replay of one trace under one `Options`, against a migrated database URL."""

    def __init__(self, trace: TraceLike, options: Options, database_url: str) -> None:
        self.trace = trace
        self.options = options
        self.url = database_url
        self.epoch = datetime.now(UTC).replace(microsecond=0)
        self.now = 0.0
        self._db_now: float | None = None
        self.sim = Simulator(job_seconds=0, max_value=options.quota, clock=lambda: self.now,
                             seed=options.seed)
        if options.faults:
            self.sim.set_faults(**options.faults)
        self.app = CountingSim(self.sim)
        self.jobs = [_Job(j) for j in trace.jobs]
        self.by_trace = {j.trace.id: j for j in self.jobs}
        self.by_queue: dict[str, _Job] = {}
        self.external = 0
        self.settings = Settings(
            database_url=database_url, fireworks_base_url=BASE_URL, fireworks_api_key=API_KEY,
            fireworks_account_id=ACCOUNT, tick_interval_seconds=options.tick_interval,
            event_admission=options.event_admission, preflight=False,
            # The simulator reports no progress for a job it is told when to finish, and a
            # `stalled` event changes nothing the replay measures.
            stall_seconds=10**9)
        self.lifecycle = invariants.Lifecycle()
        self.ticks = 0
        self.passes: Counter[str] = Counter()
        self.timeline: list[dict[str, Any]] = []
        self.idle_head_gpu_seconds = 0.0
        self.blocked: dict[str, float] = defaultdict(float)
        self._last_sample: tuple[float, int, int, tuple[int, str] | None] | None = None
        self._events: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        self._event_id = 0
        self._violation_id = 0
        self.keys: dict[str, bytes] = {}
        self.user_ids: dict[str, int] = {}

    # -- clocks --------------------------------------------------------------------------------

    def _at(self, seconds: float) -> datetime:
        return self.epoch + timedelta(seconds=seconds)

    def _sync_db(self, conn: psycopg.Connection[Any]) -> None:
        if self._db_now != self.now:
            clock.set_time(conn, self._at(self.now))
            self._db_now = self.now

    def _push(self, at: float, what: str, data: Any) -> None:
        heapq.heappush(self._events, (at, next(self._seq), what, data))

    # -- setup ---------------------------------------------------------------------------------

    def _setup(self, conn: psycopg.Connection[Any]) -> None:
        migrations.migrate(self.url)
        clock.install(conn, self._at(0))
        self._db_now = 0.0
        invariants.install(conn, self.options.quota)
        users = sorted({j.trace.user for j in self.jobs})
        for name in users:
            row = conn.execute("SELECT sftq.create_user(%s, %s)",
                               (name, self.options.cap_of(name))).fetchone()
            assert row is not None
            self.user_ids[name] = int(row[0])
            invariants.set_cap(conn, int(row[0]), self.options.cap_of(name))
            key = conn.execute("SELECT key FROM sftq.issue_key(%s)", (name,)).fetchone()
            assert key is not None
            self.keys[name] = hashlib.sha256(str(key[0]).encode()).digest()
        if self.options.max_queued is not None:
            self._set_max_queued(conn, users, self.options.max_queued)
        for ext in self.trace.external:
            self._push(ext.at, "external", ext.gpus)

    def _set_max_queued(self, conn: psycopg.Connection[Any], users: list[str], n: int) -> None:
        # The per-user limits (sql/procedures/195_user_limits.sql: set_user_limits(name,
        # rpm, max_queued, max_streams, set_rpm, set_queued, set_streams); name NULL sets
        # the default every user without limits of their own follows).
        found = conn.execute("SELECT to_regproc('sftq.set_user_limits') IS NOT NULL").fetchone()
        if not found or not found[0]:
            raise ReplayError("--max-queued needs the per-user limits (sftq.set_user_limits), "
                              "which this version's database does not have")
        conn.execute("SELECT sftq.set_user_limits(NULL, NULL, %s, NULL, false, true, false)",
                     (n,))

    # -- the main loop -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        with psycopg.connect(self.url, autocommit=True, prepare_threshold=0) as conn:
            self._setup(conn)
            db = Database(self.url, max_size=2, timeout=30.0)
            try:
                with FireworksClient(base_url=BASE_URL, api_key=API_KEY, account_id=ACCOUNT,
                                     transport=httpx.WSGITransport(app=self.app),
                                     rpm=1_000_000, timeout=30.0) as provider:
                    self._loop(conn, db, provider)
            finally:
                db.close()
            return self._result(conn, time.monotonic() - started)

    def _loop(self, conn: psycopg.Connection[Any], db: Database,
              provider: FireworksClient) -> None:
        interval = self.options.tick_interval
        gap = wake.early_tick_gap(self.settings)
        reconcile_every = wake.reconcile_interval(self.settings) \
            if self.options.event_admission else math.inf
        pending = iter(self.jobs)
        nxt: _Job | None = next(pending, None)
        dirty = False           # something happened that the next pass should see
        ended_unseen = False    # a job ended at the provider since the last pass
        wake_at: float | None = None
        last_start = -math.inf  # when the last pass started (run or skipped periodic)
        last_event = 0.0
        first_unseen_end = 0.0
        k = 0                   # the next periodic tick is at k * interval
        while True:
            next_submit = nxt.trace.submit_at if nxt is not None else math.inf
            next_event = self._events[0][0] if self._events else math.inf
            periodic = k * interval
            reconcile_at = math.inf
            if ended_unseen and reconcile_every < math.inf:
                # `sftq ticker` fires a pass whenever the last one is reconcile_every old.
                base = max(last_start, 0.0)
                reconcile_at = base + reconcile_every * max(
                    1, math.ceil((first_unseen_end - base) / reconcile_every - 1e-9))
            soonest = min(next_submit, next_event, wake_at if wake_at is not None else math.inf)
            open_jobs = nxt is not None or bool(self._events) or self.lifecycle.open > 0
            if not open_jobs:
                return
            if soonest == math.inf and not dirty and periodic > last_event + IDLE_LIMIT_SECONDS:
                stuck = self.lifecycle.unfinished()
                raise Violation(self.ticks, self.now, [(
                    f"{len(stuck)} job(s) never ended, {IDLE_LIMIT_SECONDS / 86400:g} days after "
                    "the last event (more GPUs than the quota, or a stuck job)", stuck[:10])])
            # The pass that comes first, if it comes before the next event.
            candidates: list[tuple[float, wake.Pass]] = [(periodic, "tick"),
                                                         (reconcile_at, "reconcile")]
            if wake_at is not None:
                candidates.append((wake_at, "wake"))
            when, pass_ = min(candidates, key=lambda c: (c[0], c[1] != "tick"))
            if when <= min(next_submit, next_event):
                self.now = max(self.now, when)
                if pass_ == "tick":
                    k += 1
                    last_start = when
                    if not dirty and wake_at is None:
                        continue  # nothing could change: skipped, but it counts as a start
                wake_at = None
                last_start = when
                clean = self._tick(conn, db, provider, pass_)
                if pass_ == "reconcile":
                    ended_unseen = False
                else:
                    ended_unseen = False
                    dirty = not clean
                if self.options.event_admission and self._wake_pending(conn):
                    wake_at = max(self.now + POLL, last_start + gap)
                continue
            # Events at this moment, all of them, then back to the passes.
            self.now = max(self.now, min(next_submit, next_event))
            batch: list[_Job] = []
            while nxt is not None and nxt.trace.submit_at <= self.now:
                batch.append(nxt)
                nxt = next(pending, None)
            if batch:
                self._submit(conn, batch)
                dirty = True
            while self._events and self._events[0][0] <= self.now:
                _, _, what, data = heapq.heappop(self._events)
                if what == "external":
                    self.external = int(data)
                    self.sim.set_quota(external_usage=self.external)
                    self._sync_db(conn)
                    invariants.set_external(conn, self.external)
                    dirty = True
                elif what == "end":
                    if self._provider_end(data):
                        if not ended_unseen:
                            first_unseen_end = self.now
                        dirty = ended_unseen = True
                elif what == "cancel":
                    self._cancel(conn, provider, data)
                    dirty = True
            last_event = self.now
            if self.options.event_admission and wake_at is None and self._wake_pending(conn):
                wake_at = max(self.now + POLL, last_start + gap)

    # -- events ---------------------------------------------------------------------------------

    def _submit(self, conn: psycopg.Connection[Any], batch: list[_Job]) -> None:
        self._sync_db(conn)
        plain = [j for j in batch if not j.trace.after]
        if plain:
            rows = conn.execute(
                "SELECT ord, job_id, err_message FROM sftq.api_submit_many("
                "%s::bytea[], %s::text[], %s::jsonb[], %s::text[], %s::int[], %s::text[], "
                "%s::int[], NULL::int) ORDER BY ord",
                ([self.keys[j.trace.user] for j in plain], [j.trace.kind for j in plain],
                 [json.dumps(payload(j.trace.kind)) for j in plain],
                 [f"trace {j.trace.id}"[:100] for j in plain],
                 [j.trace.gpu_count for j in plain], [None] * len(plain),
                 [None] * len(plain))).fetchall()
            for (_, job_id, err), job in zip(rows, plain, strict=True):
                self._submitted(job, job_id, err)
        for job in (j for j in batch if j.trace.after):
            after = [self.by_trace[a].queue_id for a in job.trace.after
                     if a in self.by_trace and self.by_trace[a].queue_id]
            try:
                row = conn.execute(
                    "SELECT job_id FROM sftq.api_submit_job(%s, %s, %s::jsonb, %s, %s, NULL, "
                    "NULL, NULL, %s::text[], NULL)",
                    (self.keys[job.trace.user], job.trace.kind,
                     json.dumps(payload(job.trace.kind)), f"trace {job.trace.id}"[:100],
                     job.trace.gpu_count, after)).fetchone()
            except psycopg.Error as exc:
                self._submitted(job, None, str(exc).splitlines()[0])
            else:
                self._submitted(job, row[0] if row else None, None)

    def _submitted(self, job: _Job, job_id: Any, err: str | None) -> None:
        if job_id is None:
            # Refused at submit (a per-user limit, say): it never enters the queue.
            job.provider_done = True
            job.queue_id = None
            job.refused = err or "refused"
            return
        job.queue_id = str(job_id)
        self.by_queue[job.queue_id] = job
        problems = self.lifecycle.created(job.queue_id)
        if problems:
            raise Violation(self.ticks, self.now, [(p, [job.queue_id]) for p in problems])
        t = job.trace
        if t.outcome == "CANCELLED" and t.outcome_at is not None:
            self._push(t.submit_at + t.outcome_at, "cancel", job)

    def _provider_end(self, job: _Job) -> bool:
        """The job's run at the provider is over: tell the simulator. False when it was
        already stopped (cancelled) or deleted."""
        if job.provider_done or job.queue_id is None:
            return False
        if self.lifecycle.state.get(job.queue_id) in invariants.TERMINAL:
            job.provider_done = True
            return False
        state = "JOB_STATE_FAILED" if job.trace.outcome == "FAIL" else "JOB_STATE_COMPLETED"
        job.provider_done = True
        job.ended = self.now
        try:
            self.sim.finish(job.trace.kind, provider_job_id(job.queue_id), state)
        except KeyError:
            return False
        return True

    def _cancel(self, conn: psycopg.Connection[Any], provider: FireworksClient,
                job: _Job) -> None:
        """The user cancels, as DELETE /jobs/{id} does: the queue's cancel, then (a running
        job) the provider stop and the cancel's completion."""
        if job.queue_id is None or self.lifecycle.state.get(job.queue_id) in invariants.TERMINAL:
            return
        self._sync_db(conn)
        key = self.keys[job.trace.user]
        try:
            row = conn.execute("SELECT action, kind, fireworks_job_name "
                               "FROM sftq.api_cancel_job(%s, %s)",
                               (key, job.queue_id)).fetchone()
        except psycopg.Error:
            return  # it ended meanwhile (409): nothing to cancel
        if row is None:
            return
        action, kind, name = row
        if action in ("provider_delete", "provider_cancel"):
            pid = str(name).rsplit("/", 1)[-1] if name else provider_job_id(job.queue_id)
            try:
                provider.stop_job(str(kind), pid)
            except Exception:  # noqa: BLE001 - as jobs-api: the tick finishes the cancel
                return
            if not job.provider_done:
                job.provider_done = True
                job.ended = self.now
            conn.execute("SELECT sftq.api_complete_cancel(%s, %s)", (key, job.queue_id))

    def _wake_pending(self, conn: psycopg.Connection[Any]) -> bool:
        row = conn.execute("SELECT requested_at IS NOT NULL FROM sftq.admission_wake "
                           "WHERE id").fetchone()
        return bool(row and row[0])

    # -- a pass --------------------------------------------------------------------------------

    def _tick(self, conn: psycopg.Connection[Any], db: Database, provider: FireworksClient,
              pass_: wake.Pass) -> bool:
        """Run one pass at self.now; check the invariants. True when it ended clean."""
        self._sync_db(conn)
        self.ticks += 1
        self.passes[pass_] += 1
        result = run_tick(db, provider, self.settings, holder="replay", pass_=pass_)
        # A Retry-After holds the client's calls in real time: over by the next pass here.
        provider._quiet_until = 0.0  # noqa: SLF001
        self._after_tick(conn)
        errors = result.get("errors") or []
        # Admission takes at most one job per user a pass: a pass that admitted may leave
        # another admissible job for the next one, so it is not "clean".
        return (result.get("status") != "error" and not errors and not self._loose_ends
                and not result.get("admitted"))

    def _after_tick(self, conn: psycopg.Connection[Any]) -> None:
        problems: list[tuple[str, list[str]]] = []
        # One read of the new events: the moves (for the lifecycle) and the creates at the
        # provider (when each job's run starts).
        rows = conn.execute(
            "SELECT id, job_id, event, from_state, to_state FROM sftq.job_events "
            "WHERE id > %s AND ((to_state IS NOT NULL AND from_state IS NOT NULL) "
            "OR event = 'submitted') ORDER BY id", (self._event_id,)).fetchall()
        if rows:
            self._event_id = int(rows[-1][0])
        for _, job_id, event, frm, to in rows:
            jid = str(job_id)
            if event == "submitted":
                self._started(jid)
                continue
            for p in self.lifecycle.moved(jid, str(frm), str(to)):
                problems.append((p, [jid]))
        found, self._violation_id = invariants.recorded(conn, self._violation_id)
        problems += found
        problems += [(f"provider job {p} created {self.app.created[p]} times", [p])
                     for p in self.app.twice]
        if problems:
            raise Violation(self.ticks, self.now, problems)
        self._sample(conn)

    def _started(self, job_id: str) -> None:
        """The tick created the job at the provider now: its run ends run_seconds later."""
        job = self.by_queue.get(job_id)
        if job is None or job.started is not None:
            return
        job.started = self.now
        t = job.trace
        run = t.run_seconds
        if t.outcome == "FAIL" and t.outcome_at is not None:
            run = max(0.0, min(run, t.submit_at + t.outcome_at - self.now))
        if t.outcome == "CANCELLED" and t.outcome_at is None:
            self._push(self.now + run, "cancel", job)
        else:
            self._push(self.now + run, "end", job)

    def _sample(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute(
            """SELECT (SELECT count(*) FROM sftq.jobs WHERE state = 'QUEUED'),
                      (SELECT COALESCE(sum(gpu_count), 0) FROM sftq.jobs
                        WHERE state = 'PROGRESS'),
                      (SELECT count(*) FROM sftq.jobs WHERE state = 'PROGRESS'
                          AND (submitted_at IS NULL OR cancel_requested_at IS NOT NULL)),
                      (SELECT ARRAY[j.gpu_count::text, u.name]
                         FROM sftq.jobs j JOIN sftq.users u ON u.id = j.user_id
                        WHERE j.state = 'QUEUED' AND u.disabled_at IS NULL
                          AND u.running_count < u.max_running
                          AND (j.after IS NULL OR sftq._first_unmet(j.after) IS NULL)
                        ORDER BY j.created_at, j.id LIMIT 1)""").fetchone()
        assert row is not None
        depth, in_use, loose, head = int(row[0]), int(row[1]), int(row[2]), row[3]
        self._loose_ends = loose > 0
        self._account(self.now)
        self._last_sample = (self.now, in_use, self.external,
                             (int(head[0]), str(head[1])) if head else None)
        self.timeline.append({"t": round(self.now, 3), "queue_depth": depth,
                              "gpus_in_use": in_use, "external": self.external,
                              "quota": self.options.quota})

    _loose_ends = False

    def _account(self, until: float) -> None:
        """Idle GPUs while the head of the queue did not fit, since the last sample."""
        if self._last_sample is None:
            return
        at, in_use, external, head = self._last_sample
        dt = until - at
        if dt <= 0 or head is None:
            return
        free = self.options.quota - external - in_use
        # Blocked: GPUs sit free, yet the job at the head needs more (no backfill: nobody
        # behind it may use them). A full quota is not a blocked queue.
        if free > 0 and head[0] > free:
            self.idle_head_gpu_seconds += free * dt
            self.blocked[head[1]] += dt

    # -- the answer ----------------------------------------------------------------------------

    def _result(self, conn: psycopg.Connection[Any], wall: float) -> dict[str, Any]:
        rows = conn.execute(
            "SELECT j.id, extract(epoch FROM j.started_at - j.created_at), j.state "
            "FROM sftq.jobs j").fetchall()
        waits: dict[str, list[float]] = defaultdict(list)
        slowdowns: dict[str, list[float]] = defaultdict(list)
        over = 0
        counts: Counter[str] = Counter()
        for job_id, wait_s, _state in rows:
            job = self.by_queue.get(str(job_id))
            if job is None:
                continue
            counts[job.trace.user] += 1
            if wait_s is None:
                continue
            w = float(wait_s)
            waits[job.trace.user].append(w)
            run = max(job.trace.run_seconds, 1.0)
            slowdowns[job.trace.user].append((w + run) / run)
            if w > self.options.wait_threshold:
                over += 1
        users: dict[str, Any] = {}
        for name in sorted({j.trace.user for j in self.jobs}):
            ws = waits.get(name, [])
            sl = slowdowns.get(name, [])
            users[name] = {
                "jobs": counts.get(name, 0), "ran": len(ws),
                "wait_p50": round(_percentile(ws, 0.5), 3),
                "wait_p95": round(_percentile(ws, 0.95), 3),
                "wait_max": round(max(ws, default=0.0), 3),
                "mean_slowdown": round(statistics.fmean(sl), 4) if sl else None,
                "over_threshold": sum(1 for w in ws if w > self.options.wait_threshold),
                # Every admitted job's wait, in seconds: what --plot draws per user.
                "waits": [round(w, 3) for w in ws]}
        means = [u["mean_slowdown"] for u in users.values() if u["mean_slowdown"] is not None]
        jain = (sum(means) ** 2 / (len(means) * sum(x * x for x in means))) if means else None
        end = max([self.now] + [j.ended for j in self.jobs if j.ended is not None])
        used = sum(j.trace.gpu_count * ((j.ended if j.ended is not None else end) - j.started)
                   for j in self.jobs if j.started is not None)
        self._account(end)
        quota_seconds = self.options.quota * end if end > 0 else 0.0
        return {
            "settings": self.options.as_json(),
            "users": users,
            "jain_fairness": round(jain, 4) if jain is not None else None,
            "gpu_utilisation": round(used / quota_seconds, 4) if quota_seconds else 0.0,
            "idle_gpu_hours_head_blocked": round(self.idle_head_gpu_seconds / 3600, 3),
            "blocked": {"seconds": round(sum(self.blocked.values()), 3),
                        "by_user": {u: round(s, 3) for u, s in sorted(self.blocked.items())}},
            "jobs_over_wait_threshold": over,
            "jobs": len(self.jobs),
            "refused": sum(1 for j in self.jobs if j.refused),
            "virtual_seconds": round(end, 3),
            "wall_seconds": round(wall, 3),
            "speedup": round(end / wall, 1) if wall > 0 else None,
            "ticks": self.ticks,
            "passes": dict(self.passes),
            "provider_creates": sum(self.app.created.values()),
            "timeline": self.timeline,
            "violations": [],
        }


def tick_cost(trace: TraceLike, options: Options, database_url: str, *,
              passes: int = 5) -> list[float]:
    """Milliseconds of each of `passes` periodic ticks after every job of `trace` was
    submitted at once (the admission cost per virtual tick at that queue length; bench)."""
    engine = Replay(trace, options, database_url)
    times: list[float] = []
    with psycopg.connect(database_url, autocommit=True, prepare_threshold=0) as conn:
        engine._setup(conn)  # noqa: SLF001
        # Production's cost: without the replay's own admission checks.
        conn.execute("ALTER TABLE sftq.job_events DISABLE TRIGGER sim_check_admission")
        engine._submit(conn, engine.jobs)  # noqa: SLF001
        db = Database(database_url, max_size=2, timeout=30.0)
        try:
            with FireworksClient(base_url=BASE_URL, api_key=API_KEY, account_id=ACCOUNT,
                                 transport=httpx.WSGITransport(app=engine.app),
                                 rpm=1_000_000, timeout=30.0) as provider:
                for n in range(passes):
                    engine.now = (n + 1) * options.tick_interval
                    engine._sync_db(conn)  # noqa: SLF001
                    started = time.perf_counter()
                    run_tick(db, provider, engine.settings, holder="bench")
                    times.append((time.perf_counter() - started) * 1000)
        finally:
            db.close()
    return times


def replay(trace: TraceLike, options: Options | None = None, *,
           database_url: str | None = None) -> dict[str, Any]:
    """Replay `trace` under `options` and answer the report (a JSON-able dict).

    `database_url`: a database of its own to use (it is migrated, given the virtual clock and
    the invariant checks: never point this at a real one); None starts a throw-away
    PostgreSQL cluster. A broken invariant answers the report so far with `violations`
    (tick, virtual time, what, the jobs involved) instead of raising.
    """
    options = options or Options()
    if database_url is None:
        with throwaway_database() as url:
            return _run(trace, options, url)
    return _run(trace, options, database_url)


def _run(trace: TraceLike, options: Options, url: str) -> dict[str, Any]:
    engine = Replay(trace, options, url)
    try:
        return engine.run()
    except Violation as v:
        with psycopg.connect(url, autocommit=True) as conn:
            result = engine._result(conn, 0.0)  # noqa: SLF001
        result["violations"] = [{"tick": v.tick, "at": round(v.at, 3), "what": what,
                                 "jobs": jobs} for what, jobs in v.problems]
        return result


def compare(trace: TraceLike, sides: Iterable[Options], *,
            database_url_for: Callable[[int], str] | None = None) -> list[dict[str, Any]]:
    """Each of `sides` over the same trace, each on a database of its own."""
    results = []
    for n, options in enumerate(sides):
        url = database_url_for(n) if database_url_for else None
        results.append(replay(trace, options, database_url=url))
    return results


__all__ = ["COLLECTIONS", "Options", "Replay", "ReplayError", "Violation", "compare", "replay",
           "with_overrides"]
