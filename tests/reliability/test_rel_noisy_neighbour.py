"""The noisy neighbour (issue 52): one user hammers every shared part as fast as it can, with
hostile input, while five other users submit and cancel normally, against the simulator at
FIREWORKS_RPM=60, for a minute and more.

The hostile user loops POST /jobs:validate and POST /jobs with payloads hypothesis made
(control characters, unicode, `%`, `/`, `..`, `?`, `#`, very long strings, deep nesting,
numbers as strings, in every resource field, with validate on and off), retries each 429 at
once, and holds 25 live streams and 25 MCP waits. What must hold for everybody else:

- every tick answers 200 with status ok (and none ever meets a 429 from the provider);
- every normal user's job is admitted by the first tick that ran admission after it was
  submitted (the quota is large, so every head fits: nothing else may delay it);
- the provider never sees more than FIREWORKS_RPM requests in any 60 s window;
- nothing anybody sent is answered 5xx;
- the server's threads come back to their baseline once the load stops.

SFTQ_REL_NOISY_SECONDS makes the run longer (docs/reliability.md quotes its figures).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from rel_support import ACCOUNT, TICK_SECRET, GatewayThread, env_float, make_users, rel_settings

from sftq_server.core.settings import StreamSettings
from sftq_server.db import Database
from sftq_server.http.mcp import IO_THREADS
from sftq_server.scheduler.wake import WakePlan, WakeState
from sftq_server.simulator import Simulator, SimulatorServer

RPM = 60
SECONDS = env_float("SFTQ_REL_NOISY_SECONDS", 60.0)
PERIODIC_SECONDS = 30.0
NORMAL_USERS = 5
STREAMS = 25
MCP_WAITS = 25
QUOTA = 500  # every head fits: a normal job waits for a tick, never for room
DATASET = f"accounts/{ACCOUNT}/datasets/chats"
MODEL = "accounts/fireworks/models/qwen3-8b"
NORMAL_BODIES = {
    "SFT": {"dataset": DATASET, "baseModel": MODEL},
    "DPO": {"dataset": DATASET, "trainingConfig": {"baseModel": MODEL}},
    "RFT": {"dataset": DATASET, "evaluator": f"accounts/{ACCOUNT}/evaluators/grader",
            "inferenceParameters": {"responseCandidatesCount": 4}},
}
RESOURCE_PATHS = {
    "SFT": [("dataset",), ("evaluationDataset",), ("baseModel",), ("warmStartFrom",),
            ("outputModel",)],
    "DPO": [("dataset",), ("evaluationDataset",), ("trainingConfig", "baseModel"),
            ("trainingConfig", "warmStartFrom"), ("trainingConfig", "outputModel")],
    "RFT": [("dataset",), ("evaluationDataset",), ("evaluator",),
            ("trainingConfig", "baseModel"), ("trainingConfig", "outputModel")],
}
DEEP = "\x00deep\x00"  # a value replaced by raw nested JSON text (json.dumps would recurse)


class TimedSim(Simulator):
    """The simulator, noting when each Fireworks-path request arrived (the 60 s windows)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arrivals: list[float] = []
        self._arrivals_lock = threading.Lock()

    def __call__(self, environ: Any, start_response: Any) -> Any:
        if not str(environ.get("PATH_INFO", "")).startswith("/_sim"):
            with self._arrivals_lock:
                self.arrivals.append(time.monotonic())
        return super().__call__(environ, start_response)


# -- hostile values, made by hypothesis ------------------------------------------------------

_NAME_TRICKS = ["%2F", "%2e%2e", "..", "../..", "a/b", "?x=1", "#frag", "a?b#c", "\n", "\t",
                "\x00", "\ud800", "\u202e", "\u00e9t\u00e9", "\U0001f600", " ", "", "%", "\\"]
hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(_NAME_TRICKS),
    st.builds(lambda coll, trick, tail: f"accounts/{ACCOUNT}/{coll}/{trick}{tail}",
              st.sampled_from(["datasets", "models", "evaluators", "quotas", "..", ""]),
              st.sampled_from(_NAME_TRICKS), st.text(max_size=8)),
    st.builds(lambda acct: f"accounts/{acct}/datasets/d", st.sampled_from(
        ["other-acct", "y", "fireworks", "UPPER", "..", "a/b", ""])),
    st.integers(min_value=200, max_value=6000).map(lambda n: "x" * n),
    st.integers(min_value=100, max_value=3000).map(lambda n: "a/" * n),
)
hostile_value = st.one_of(
    hostile_text,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: f if f == f else None),
    st.none(), st.booleans(),
    st.lists(st.text(max_size=5), max_size=3),
    st.just(DEEP),
)


CATALOGUE: list[Any] = [
    f"accounts/{ACCOUNT}/datasets/foo\n", f"accounts/{ACCOUNT}/datasets/a%2Fb",
    f"accounts/{ACCOUNT}/datasets/../quotas/x", f"accounts/{ACCOUNT}/datasets/a?x=1#f",
    "accounts/other-acct/datasets/d1", "accounts/y/evaluators/ev", "x" * 5000, "a/" * 2000,
    "12", "-1", "1e309", 1e308, -(2**63), 2**64, None, True, [], {}, DEEP, DEEP,
]


@dataclass
class Tally:
    """Every answer one side got, by status; what went wrong, in words."""

    statuses: Counter[int] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, status: int, what: str, text: str = "") -> None:
        with self.lock:
            self.statuses[status] += 1
            if status >= 500 and len(self.problems) < 20:
                self.problems.append(f"{what}: HTTP {status} {text[:200]}")

    def problem(self, text: str) -> None:
        with self.lock:
            if len(self.problems) < 20:
                self.problems.append(text)


def _set(body: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        inner = body.get(key)
        if not isinstance(inner, dict):
            inner = body[key] = {}
        body = inner
    body[path[-1]] = value


def _hostile_request(rng: random.Random, values: list[Any]) -> bytes:
    kind = rng.choice(["SFT", "DPO", "RFT", "sft", "Rft", "PPO", 7])
    base = json.loads(json.dumps(NORMAL_BODIES.get(str(kind).upper(), NORMAL_BODIES["SFT"])))
    for path in rng.sample(RESOURCE_PATHS.get(str(kind).upper(), RESOURCE_PATHS["SFT"]),
                           rng.randint(1, 3)):
        _set(base, path, rng.choice(values))
    body: dict[str, Any] = {"kind": kind, "fireworks_payload": base,
                            "validate": rng.choice(["on", "off", "off", None, "OFF", 1])}
    if rng.random() < 0.3:
        body["gpu_count"] = rng.choice([1, 4, 64, 0, -1, "4", 10_000, None, 2.5])
    if rng.random() < 0.2:
        body["display_name"] = rng.choice(values)
    if rng.random() < 0.1:
        body["after"] = rng.choice([["nope"], [rng.choice(values)], ["0" * 8], "x"])
    text = json.dumps(body)
    if DEEP in text:
        depth = rng.choice([50, 500, 2000, 5000])
        text = text.replace(json.dumps(DEEP), '{"a":' * depth + "1" + "}" * depth, 1)
        text = text.replace(json.dumps(DEEP), "null")
    return text.encode()


# -- the actors ------------------------------------------------------------------------------

def hostile_loop(base: str, key: str, values: list[Any], stop: threading.Event,
                 tally: Tally, seed: int) -> None:
    """As fast as it can: validate and submit garbage, retrying every 429 at once."""
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    with httpx.Client(timeout=30) as http:
        while not stop.is_set():
            path = rng.choice(["/jobs", "/jobs:validate"])
            body = _hostile_request(rng, values)
            for _ in range(3):  # a 429 is retried at once: a careless agent's loop
                try:
                    answer = http.post(base + path, content=body, headers=headers)
                except httpx.HTTPError as exc:
                    tally.problem(f"hostile {path}: {type(exc).__name__}: {exc}")
                    break
                tally.note(answer.status_code, f"hostile POST {path}", answer.text)
                if answer.status_code != 429:
                    break


def hold_stream(base: str, key: str, stop: threading.Event, tally: Tally) -> None:
    """One live stream, held until the end (or refused with 429 too_many_streams)."""
    headers = {"Authorization": f"Bearer {key}", "Accept": "text/event-stream"}
    try:
        with httpx.Client(timeout=httpx.Timeout(5, read=5)) as http, \
                http.stream("GET", base + "/jobs/stream", headers=headers) as answer:
            tally.note(answer.status_code, "hostile stream")
            if answer.status_code != 200:
                return
            chunks = answer.iter_bytes()
            while not stop.is_set():
                try:
                    next(chunks)
                except (StopIteration, httpx.ReadTimeout):
                    if stop.is_set():
                        return
    except httpx.HTTPError as exc:
        if not stop.is_set():
            tally.problem(f"hostile stream: {type(exc).__name__}: {exc}")


def hold_mcp_wait(mcp_url: str, key: str, job_id: str, tally: Tally) -> None:
    """One MCP wait_for_job on a job that ends when the test cancels it."""
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "wait_for_job",
                       "arguments": {"job_id": job_id, "timeout_seconds": 3600}}}
    headers = {"Authorization": f"Bearer {key}",
               "Accept": "application/json, text/event-stream"}
    try:
        answer = httpx.post(mcp_url, json=call, headers=headers, timeout=SECONDS + 120)
    except httpx.HTTPError as exc:
        tally.problem(f"hostile MCP wait: {type(exc).__name__}: {exc}")
        return
    tally.note(answer.status_code, "hostile MCP wait", answer.text)


def normal_user(base: str, key: str, stop: threading.Event, tally: Tally, seed: int,
                jobs: list[str]) -> None:
    """Submits a job, waits for it to run, cancels it or lets it finish, and again."""
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(timeout=30, headers=headers) as http:
        while not stop.is_set():
            kind = rng.choice(["SFT", "DPO", "RFT"])
            answer = http.post(base + "/jobs", json={
                "kind": kind, "gpu_count": rng.choice([1, 2, 4]),
                "display_name": f"normal {kind}", "fireworks_payload": NORMAL_BODIES[kind]})
            tally.note(answer.status_code, "normal POST /jobs", answer.text)
            if answer.status_code != 201:
                tally.problem(f"normal submit: HTTP {answer.status_code} {answer.text[:200]}")
                stop.wait(1)
                continue
            job_id = answer.json()["id"]
            jobs.append(job_id)
            cancel_after = rng.choice([None, None, 2.0, 6.0])
            started: float | None = None
            while not stop.is_set():
                got = http.get(f"{base}/jobs/{job_id}")
                tally.note(got.status_code, "normal GET /jobs/{id}", got.text)
                state = got.json().get("state") if got.status_code == 200 else None
                if state in ("SUCCESS", "FAIL", "CANCELLED"):
                    break
                if state == "PROGRESS":
                    started = started or time.monotonic()
                    if cancel_after is not None and time.monotonic() - started > cancel_after:
                        gone = http.delete(f"{base}/jobs/{job_id}")
                        tally.note(gone.status_code, "normal DELETE /jobs/{id}", gone.text)
                        cancel_after = None
                stop.wait(0.5)


@dataclass
class TickLog:
    answers: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)


def ticker(tick_url: str, db_url: str, settings: Any, stop: threading.Event,
           log: TickLog) -> None:
    """What `sftq ticker` does: the periodic tick, plus woken ticks and reconcile passes as
    the wake flag and the deployment's settings allow."""
    plan = WakePlan.from_settings(settings)
    db = Database(db_url, max_size=1)
    bodies: dict[str, dict[str, Any]] = {"tick": {}, "wake": {"wake": True},
                                         "reconcile": {"pass": "reconcile"}}
    last_periodic = 0.0
    try:
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {TICK_SECRET}"}) as http:
            while not stop.is_set():
                due: str | None = None
                if time.monotonic() - last_periodic >= PERIODIC_SECONDS:
                    due, last_periodic = "tick", time.monotonic()
                else:
                    due = plan.due(WakeState.read(db))
                if due is None:
                    stop.wait(0.25)
                    continue
                answer = http.post(tick_url, json=bodies[due])
                try:
                    body = answer.json()
                except ValueError:
                    body = {"text": answer.text[:300]}
                log.answers.append((due, answer.status_code, body))
    finally:
        db.close()


def _windows(arrivals: list[float], width: float = 60.0) -> int:
    """The most requests inside any window of `width` seconds."""
    times = sorted(arrivals)
    best, j = 0, 0
    for i, at in enumerate(times):
        while times[j] <= at - width:
            j += 1
        best = max(best, i - j + 1)
    return best


@pytest.fixture
def sim() -> Iterator[tuple[TimedSim, SimulatorServer]]:
    simulator = TimedSim(account_id=ACCOUNT, job_seconds=8.0, max_value=QUOTA)
    simulator.set_rate_limit({"rpm": RPM})
    with SimulatorServer(simulator) as running:
        yield simulator, running


@hsettings(max_examples=1, deadline=None, database=None, phases=[Phase.generate],
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                  HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(drawn=st.lists(hostile_value, min_size=60, max_size=60, unique_by=repr))
def test_one_noisy_user_cannot_hurt_the_others(drawn: list[Any], db_url: str,
                                               sim: tuple[TimedSim, SimulatorServer],
                                               figures: dict[str, Any]) -> None:
    simulator, served = sim
    # What hypothesis drew (different each run), and the tricks every run must try.
    values = [*drawn, *_NAME_TRICKS, *CATALOGUE]
    settings = rel_settings(
        db_url, served.url, fireworks_rpm=RPM, preflight=True, preflight_budget_ms=2000.0,
        tick_lease_seconds=30.0, tick_interval_seconds=PERIODIC_SECONDS,
        stream=StreamSettings(heartbeat_seconds=1.0, max_seconds=SECONDS + 60))
    with psycopg.connect(db_url, autocommit=True) as conn:
        # Fresh names: hypothesis runs the body again to report a failure.
        tag = uuid.uuid4().hex[:6]
        names = [f"noisy-{tag}", *(f"normal{i}-{tag}" for i in range(NORMAL_USERS))]
        users = make_users(conn, len(names), names=names)
    noisy, normals = users[0], users[1:]
    gateway = GatewayThread(settings)
    base = gateway.jobs_url
    mcp_url = gateway.url + "/functions/v1/mcp"
    stop, tally, normal_tally, ticks = threading.Event(), Tally(), Tally(), TickLog()
    threads: list[threading.Thread] = []
    waiters: list[threading.Thread] = []
    normal_jobs: list[str] = []
    try:
        # Each part once first (a request, a stream, an MCP call), so the baseline counts the
        # threads the server keeps for good (pools, the stream hub's and MCP's loops).
        warm = {"Authorization": f"Bearer {normals[0].keys[0]}"}
        httpx.get(base + "/jobs", headers=warm)
        with httpx.stream("GET", base + "/jobs/stream", headers=warm, timeout=10) as live:
            next(live.iter_bytes())
        httpx.post(mcp_url, headers={**warm, "Accept": "application/json, text/event-stream"},
                   json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=30)
        time.sleep(3.0)
        baseline = threading.active_count()
        baseline_names = {t.name for t in threading.enumerate()}
        # The jobs the MCP waits wait on: the noisy user's own, queued (validate off).
        hold_jobs = []
        for _ in range(MCP_WAITS):
            made = httpx.post(base + "/jobs", headers={"Authorization": f"Bearer {noisy.keys[0]}"},
                              json={"kind": "SFT", "fireworks_payload": NORMAL_BODIES["SFT"],
                                    "validate": "off", "gpu_count": 1})
            assert made.status_code == 201, made.text
            hold_jobs.append(made.json()["id"])
        started = time.monotonic()
        threads.append(threading.Thread(target=ticker, args=(
            gateway.tick_url, db_url, settings, stop, ticks), name="noisy-ticker"))
        for i in range(3):
            threads.append(threading.Thread(target=hostile_loop, args=(
                base, noisy.keys[0], values, stop, tally, 52 + i), name=f"noisy-{i}"))
        for _ in range(STREAMS):
            threads.append(threading.Thread(target=hold_stream, args=(
                base, noisy.keys[0], stop, tally), name="noisy-stream"))
        for user in normals:
            threads.append(threading.Thread(target=normal_user, args=(
                base, user.keys[0], stop, normal_tally, user.id, normal_jobs),
                name=f"normal-{user.name}"))
        for job_id in hold_jobs:
            waiters.append(threading.Thread(target=hold_mcp_wait, args=(
                mcp_url, noisy.keys[0], job_id, tally), name="noisy-mcp-wait"))
        for t in [*threads, *waiters]:
            t.start()
        stop.wait(SECONDS)
        stop.set()
        # The MCP waits end when their jobs do.
        with psycopg.connect(db_url, autocommit=True) as conn:
            for job_id in hold_jobs:
                with contextlib.suppress(psycopg.Error):  # it may have ended by itself
                    conn.execute("SELECT sftq.cancel(%s, %s)", (noisy.id, job_id))
        for t in [*threads, *waiters]:
            t.join(90)
        stuck = [t.name for t in [*threads, *waiters] if t.is_alive()]
        assert not stuck, f"threads still running: {stuck}"
        elapsed = time.monotonic() - started
        # The server's threads come back (streams notice their clients left at a heartbeat).
        deadline = time.monotonic() + 30
        while threading.active_count() > baseline + 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        threads_after = threading.active_count()
        # The loops' worker pools are bounded (IO_THREADS each) and kept: not a leak.
        pools = Counter(t.name.split("_")[0] for t in threading.enumerate()
                        if t.name.startswith(("sftq-mcp-io", "sftq-stream-io")))
        extra = sorted(t.name for t in threading.enumerate()
                       if t.name not in baseline_names
                       and not t.name.startswith(("sftq-mcp-io", "sftq-stream-io")))
    finally:
        stop.set()
        gateway.stop()

    with psycopg.connect(db_url, autocommit=True) as conn:
        tick_rows = conn.execute(
            "SELECT id, started_at, finished_at, status, quota_limit, errors, detail "
            "FROM sftq.scheduler_ticks ORDER BY id").fetchall()
        admitted = dict(conn.execute(
            "SELECT j.id::text, e.at FROM sftq.jobs j JOIN sftq.job_events e ON e.job_id = j.id "
            "WHERE e.event = 'admitted' AND j.id::text = ANY(%s)", (normal_jobs,)).fetchall())
        created = dict(conn.execute(
            "SELECT id::text, created_at FROM sftq.jobs WHERE id::text = ANY(%s)",
            (normal_jobs,)).fetchall())

    # Every tick answered 200 with status ok; none met a 429.
    ran = [(p, s, b) for p, s, b in ticks.answers if b.get("status") != "skipped"]
    bad_ticks = [(p, s, b.get("status"), b.get("errors")) for p, s, b in ticks.answers
                 if s != 200 or b.get("status") not in ("ok", "skipped")]
    assert ran and not bad_ticks, bad_ticks[:5]
    row_problems = [(i, st_, errs) for i, _, _, st_, _, errs, _ in tick_rows if st_ != "ok"]
    assert not row_problems, row_problems[:5]
    assert not [e for row in tick_rows for e in row[5] if "429" in e or "rate limit" in e]
    assert simulator.rate_limit()["refused"] == 0

    # The provider never saw more than FIREWORKS_RPM requests in a minute.
    busiest = _windows(simulator.arrivals)
    assert busiest <= RPM, f"{busiest} requests in one 60 s window"

    # No 5xx, for anybody; the noisy user met its limits, the others never did.
    assert not tally.problems and not normal_tally.problems, (tally.problems,
                                                              normal_tally.problems)
    assert not [s for s in (*tally.statuses, *normal_tally.statuses) if s >= 500]
    assert tally.statuses[429] > 0
    assert normal_tally.statuses[429] == 0

    # Every normal job was admitted by the first tick that ran admission after its submit.
    admitting = [(started_at, finished_at) for _, started_at, finished_at, _, limit, _, _
                 in tick_rows if limit is not None and finished_at is not None]
    late = []
    for job_id in normal_jobs:
        first = next(((s, f) for s, f in admitting if s > created[job_id]), None)
        if first is None:
            continue  # submitted after the last admission ran
        if job_id not in admitted or admitted[job_id] > first[1]:
            late.append((job_id, created[job_id], first, admitted.get(job_id)))
    assert not late, late[:5]
    assert len(admitted) >= NORMAL_USERS

    # Threads back to the baseline.
    assert len(extra) <= 2, (baseline, threads_after, extra)
    assert all(n <= IO_THREADS for n in pools.values()), pools

    figures.update({
        "seconds": round(elapsed, 1),
        "noisy_requests": sum(tally.statuses.values()),
        "noisy_429": tally.statuses[429],
        "noisy_by_status": dict(sorted(tally.statuses.items())),
        "normal_requests": sum(normal_tally.statuses.values()),
        "normal_jobs": len(normal_jobs),
        "normal_admitted": len(admitted),
        "ticks_run": len(ran),
        "ticks_by_pass": dict(Counter(p for p, _, _ in ran)),
        "provider_requests": len(simulator.arrivals),
        "busiest_60s_window": busiest,
        "threads_baseline": baseline,
        "threads_after": threads_after,
        "threads_extra_after": len(extra),
        "io_pool_threads": dict(pools),
    })
