"""Helpers for the reliability tests: a simulator that records every answer and injects the
faults a network adds, the gateway on loopback, HTTP client workers, tick workers, and the
invariant checks (each returns a list of violations, so a broken invariant names itself).

Every loop here is bounded twice, by a count and by a deadline, and stops by itself.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import httpx
import psycopg

from sftq_server.core.settings import Settings
from sftq_server.simulator import COLLECTIONS, TERMINAL_STATES, Simulator

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "sim-account"
# Long and distinctive, so that a leak anywhere is found by a plain substring search.
FW_KEY = "fw-REL-provider-key-7a11ce5ecre7"
TICK_SECRET = "rel-tick-secret-0f1e2d3c4b5a69788796a5b4"
WANDB_SECRET = "wandb-REL-SECRET-9c0ffee1234"
AWS_SECRET = "aws-REL-SECRET-deadbeef5678"
AZURE_SECRET = "azure-REL-SECRET-0badcafe9999"
PAYLOAD_SECRETS = (WANDB_SECRET, AWS_SECRET, AZURE_SECRET)

Conn = psycopg.Connection[Any]


# --- configuration: short in CI, longer for a local soak -----------------------------------------

def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def seed() -> int:
    return env_int("SFTQ_REL_SEED", 20260501)


# --- payloads ------------------------------------------------------------------------------------

def payload(kind: str, *, valid: bool = True, tag: str = "") -> dict[str, Any]:
    """A Fireworks body the simulator accepts (or answers 400 to, when valid=False). Every kind
    carries secrets in the places Fireworks bodies do."""
    body: dict[str, Any] = {
        "dataset": f"accounts/rel/datasets/d{tag}",
        "wandbConfig": {"enabled": True, "apiKey": WANDB_SECRET, "project": "rel"},
        "awsS3Config": {"credentialsSecret": AWS_SECRET},
        # A field Fireworks' bodies have: the simulator, like Fireworks, refuses any other.
        "azureBlobStorageConfig": {"credentialsSecret": AZURE_SECRET},
    }
    if kind == "SFT":
        body["baseModel"] = "accounts/fireworks/models/qwen3-8b"
    elif kind == "DPO":
        body["trainingConfig"] = {"baseModel": "accounts/fireworks/models/qwen3-8b"}
    else:
        body["evaluator"] = "accounts/rel/evaluators/e"
        body["inferenceParameters"] = {"responseCandidatesCount": 4}
    if not valid:
        del body["dataset"]
    return body


def pid(job_id: uuid.UUID | str) -> str:
    return "sftq-" + uuid.UUID(str(job_id)).hex


# --- the simulator, recording answers and adding network faults ----------------------------------

@dataclass
class Answer:
    method: str
    op: str  # create | get | list | delete | cancel | quota | other
    provider_id: str
    status: int
    fault: str | None  # None, or what this wrapper did: forced-<status>, drop, lost


# What a provider answers when it refuses one job's payload (not our credentials), and a 409
# that is not "already exists": the two answers issue 10 says the tick used to misread.
FORBIDDEN_BODY = {"code": 7, "message": "permission denied on model accounts/other/models/private",
                  "details": []}
ABORTED_BODY = {"code": 10, "message": "ABORTED: concurrent modification, try again",
                "details": []}


class FaultySim(Simulator):
    """The simulator, plus: every answer it gave (the simulator logs requests, not answers, and
    "created exactly once" needs answers), and faults a network adds that the simulator's own
    fault injection does not: an answer lost *after* the request was applied (`lost_rate`), and
    per-provider-id rules (`rules[pid](op, n)` -> None | "503" | "429" | "drop" | "lost" |
    "403" | "409"). Drawn at random too: a job whose every create is refused with a 403 for the
    job's own sake (`forbidden_rate`, drawn once per job) and creates answered 409 ABORTED
    (`aborted_rate`, drawn per create); neither is applied. With `draw_by` N, each of the two
    that has not come up by the N-th job created is forced on it, so a short run has both.
    """

    def __init__(self, *, lost_rate: float = 0.0, lost_seconds: float = 0.5,
                 rng_seed: int = 1, forbidden_rate: float = 0.0, aborted_rate: float = 0.0,
                 draw_by: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lost_rate = lost_rate
        self.lost_seconds = lost_seconds
        self.forbidden_rate = forbidden_rate
        self.aborted_rate = aborted_rate
        self.forbidden: set[str] = set()  # also jobs a test marks by hand
        self.forbidden_drawn = 0
        self.aborted = 0
        self.draw_by = draw_by
        self._drawn: set[str] = set()
        self.rules: dict[str, Callable[[str, int], str | None]] = {}
        self.answers: list[Answer] = []
        self._calls_per_pid: Counter[tuple[str, str]] = Counter()
        self._rec_lock = threading.Lock()
        self._wrng = random.Random(rng_seed)
        self._stopping = threading.Event()

    def _due(self) -> bool:
        return 0 < self.draw_by <= len(self._drawn)

    def release(self) -> None:
        """Wake every handler sleeping out an injected fault (before the server stops)."""
        self._stopping.set()

    @staticmethod
    def _classify(method: str, path: str, query: dict[str, str]) -> tuple[str, str]:
        parts = path.rstrip("/").split("/")
        # ["", "v1", "accounts", acct, collection|quotas, id[:verb]]
        if len(parts) >= 5 and parts[4] == "quotas":
            return "quota", ""
        if len(parts) == 5 and parts[4] in COLLECTIONS:
            if method == "POST":
                return "create", query.get(COLLECTIONS[parts[4]][1], "")
            return "list", ""
        if len(parts) == 6 and parts[4] in COLLECTIONS:
            job_id, _, verb = parts[5].partition(":")
            if verb == "cancel":
                return "cancel", job_id
            return ("delete" if method == "DELETE" else "get"), job_id
        return "other", ""

    def __call__(self, environ: Any, start_response: Any) -> Any:
        path = str(environ.get("PATH_INFO", ""))
        if not path.startswith("/v1/"):
            return super().__call__(environ, start_response)
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        query = dict(parse_qsl(str(environ.get("QUERY_STRING", ""))))
        op, provider_id = self._classify(method, path, query)
        with self._rec_lock:
            n = self._calls_per_pid[(op, provider_id)]
            self._calls_per_pid[(op, provider_id)] += 1
            lose = bool(self.lost_rate) and op in ("create", "delete", "cancel") \
                and self._wrng.random() < self.lost_rate
            if op == "create" and provider_id and provider_id not in self._drawn:
                self._drawn.add(provider_id)
                if self.forbidden_rate and (self._wrng.random() < self.forbidden_rate
                                            or (self._due() and not self.forbidden_drawn)):
                    self.forbidden.add(provider_id)
                    self.forbidden_drawn += 1
            drawn = None
            if op == "create" and provider_id in self.forbidden:
                drawn = "403"
            elif op == "create" and self.aborted_rate and (
                    self._wrng.random() < self.aborted_rate or (self._due() and not self.aborted)):
                drawn = "409"
                self.aborted += 1
        rule = self.rules.get(provider_id) if provider_id else None
        forced = rule(op, n) if rule is not None else drawn
        if forced in ("403", "409"):
            # Refused before it is applied, with the body Fireworks would send.
            status = int(forced)
            body = json.dumps(FORBIDDEN_BODY if status == 403 else ABORTED_BODY).encode()
            reason = "Forbidden" if status == 403 else "Conflict"
            start_response(f"{status} {reason}", [("Content-Type", "application/json"),
                                                  ("Content-Length", str(len(body)))])
            self._record(method, op, provider_id, status, f"forced-{forced}")
            return [body]
        if forced in ("503", "429"):
            # Refused before it is applied, like a gateway in front of the provider.
            body = json.dumps({"code": 14, "message": f"forced {forced}", "details": []}).encode()
            start_response(f"{forced} Forced", [("Content-Type", "application/json"),
                                                ("Content-Length", str(len(body)))])
            self._record(method, op, provider_id, int(forced), f"forced-{forced}")
            return [body]
        if forced == "drop":
            # Lost on the way in: the client times out, nothing was applied.
            self._record(method, op, provider_id, 504, "drop")
            self._stopping.wait(self.lost_seconds)
            start_response("504 Dropped", [("Content-Length", "0")])
            return [b""]
        seen: dict[str, int] = {}

        def capture(status: str, headers: Any, exc_info: Any = None) -> Any:
            seen["status"] = int(status.split()[0])
            return start_response(status, headers, exc_info)

        chunks = b"".join(super().__call__(environ, capture))
        status = seen.get("status", 0)
        lost = forced == "lost" or (lose and status < 300)
        # Recorded as soon as it is applied, before any injected delay: a check that runs
        # while the answer is still "in flight" must already count this create.
        self._record(method, op, provider_id, status, "lost" if lost else None)
        if lost:
            # Applied, then the answer is lost: the client times out and must not create twice.
            self._stopping.wait(self.lost_seconds)
        return [chunks]

    def _record(self, method: str, op: str, provider_id: str, status: int,
                fault: str | None) -> None:
        with self._rec_lock:
            self.answers.append(Answer(method, op, provider_id, status, fault))

    def snapshot(self) -> list[Answer]:
        with self._rec_lock:
            return list(self.answers)

    def created_ok(self) -> Counter[str]:
        """Per provider id, how many creates made a job (answered 2xx, even if the answer was
        then lost on its way back)."""
        return Counter(a.provider_id for a in self.snapshot()
                       if a.op == "create" and 200 <= a.status < 300)

    def injected(self) -> Counter[str]:
        """Faults injected so far, by kind: the simulator's own (5xx, 429, timeouts) and ours."""
        kinds: Counter[str] = Counter()
        for req in self.requests():
            if req.get("fault"):
                kinds["timeout" if req["fault"] == "timeout" else f"http-{req['fault']}"] += 1
        for a in self.snapshot():
            if a.fault:
                kinds[a.fault] += 1
        return kinds

    def running_gpus(self) -> int:
        """GPUs really held at the provider right now (the simulator's usage, ours only)."""
        return int(sum(j["sim"]["gpuCount"] for j in self.jobs() if j["sim"]["countsInUsage"]))


# --- the gateway on loopback ---------------------------------------------------------------------

class GatewayThread:
    """`sftq_server.http.gateway.make_server` serving on 127.0.0.1 in a thread; `stop()` ends it."""

    def __init__(self, settings: Any, provider_factory: Any = None) -> None:
        from sftq_server.http.gateway import make_server

        self.server = make_server("127.0.0.1", 0, settings, provider_factory=provider_factory)
        self.url = f"http://127.0.0.1:{self.server.port}"
        self.jobs_url = self.url + "/functions/v1/jobs-api"
        self.tick_url = self.url + "/functions/v1/scheduler-tick"
        self._thread = threading.Thread(target=self.server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, name="rel-gateway")
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self._thread.join(30)
        self.server.server_close()
        self.server.app.close()


# --- settings ------------------------------------------------------------------------------------

def rel_settings(db_url: str, sim_url: str, **overrides: Any) -> Settings:
    """Settings for a gateway or in-process ticks against the simulator at `sim_url`."""
    values: dict[str, Any] = {
        "database_url": db_url, "db_pool_max": 8, "db_timeout_seconds": 5.0,
        "tick_secret": TICK_SECRET, "fireworks_base_url": sim_url,
        "fireworks_api_key": FW_KEY, "fireworks_account_id": ACCOUNT,
        "fireworks_timeout_seconds": 5.0, "usage_grace_seconds": 300.0,
        "tick_lease_seconds": 10.0,
        # In-process ticks here come back to back: no backoff between create attempts
        # unless a test asks for one (the fault run's tick processes keep a short one).
        "submit_backoff_seconds": 0.0,
    }
    values.update(overrides)
    return Settings(**values)


# --- users ---------------------------------------------------------------------------------------

@dataclass
class User:
    name: str
    id: int
    cap: int
    keys: list[str]


def make_users(conn: Conn, n: int, *, keys_per_user: int = 1, caps: dict[int, int] | None = None,
               prefix: str = "u", names: list[str] | None = None) -> list[User]:
    """n users (named prefix0, prefix1, ... unless `names` are given), cap 1 unless `caps`
    says otherwise, each with `keys_per_user` keys."""
    users = []
    for i in range(n):
        cap = (caps or {}).get(i, 1)
        name = names[i] if names else f"{prefix}{i}"
        row = conn.execute("SELECT sftq.create_user(%s, %s)", (name, cap)).fetchone()
        assert row is not None
        keys = [str(conn.execute("SELECT key FROM sftq.issue_key(%s)", (name,)).fetchone()[0])  # type: ignore[index]
                for _ in range(keys_per_user)]
        users.append(User(name, int(row[0]), cap, keys))
    return users


# --- HTTP clients --------------------------------------------------------------------------------

@dataclass
class ClientStats:
    sent: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    accepted: dict[str, str] = field(default_factory=dict)  # job id -> user name
    unacknowledged: int = 0  # POSTs that never got an answer, even after retries
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def merge(self, other: ClientStats) -> None:
        with self.lock:
            self.sent.update(other.sent)
            self.statuses.update(other.statuses)
            self.accepted.update(other.accepted)
            self.unacknowledged += other.unacknowledged
            self.problems.extend(other.problems)

    @property
    def requests(self) -> int:
        return sum(self.sent.values())

    @property
    def transport_errors(self) -> int:
        """Requests that got no HTTP answer at all (refused or dropped connection, timeout)."""
        return sum(n for k, n in self.statuses.items() if not k.rsplit(":", 1)[1].isdigit())


KINDS = ("SFT", "DPO", "RFT")
GPU_CHOICES = (1, 2, 2, 4, 4, 8)


def client_worker(base: str, user: User, key: str, deadline: float, max_requests: int,
                  rng: random.Random, stats: ClientStats, *, invalid_rate: float = 0.03,
                  allow_unavailable: bool = False, stop: threading.Event | None = None,
                  pause: float = 0.0) -> None:
    """One client thread: enqueue (half with an Idempotency-Key, retried under the same key on
    503 or a dropped connection), cancel its own jobs, read; `pause` seconds at most between
    requests. Every answer is classified: a 5xx (other than 503 when `allow_unavailable`) or
    a 404 on its own job is a problem."""
    mine: list[str] = []
    local = ClientStats()
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, timeout=15.0, headers=headers) as http:
        n = 0
        while n < max_requests and time.monotonic() < deadline and not (stop and stop.is_set()):
            n += 1
            if pause:
                time.sleep(rng.uniform(0.0, pause))
            roll = rng.random()
            if roll < 0.5 or not mine:
                kind = rng.choice(KINDS)
                body = {"kind": kind, "gpu_count": rng.choice(GPU_CHOICES),
                        "display_name": f"{user.name}-{n}",
                        "fireworks_payload": payload(kind, valid=rng.random() >= invalid_rate,
                                                     tag=str(n))}
                idem = str(uuid.uuid4()) if rng.random() < 0.5 or allow_unavailable else None
                answer = _post_job(http, body, idem, local, allow_unavailable, deadline)
                if answer is not None:
                    job_id = str(answer["id"])
                    mine.append(job_id)
                    local.accepted[job_id] = user.name
            elif roll < 0.8:
                job_id = rng.choice(mine)
                resp = _call(http, "DELETE", f"/jobs/{job_id}", local, "cancel")
                if resp is not None:
                    _judge(resp, local, allow_unavailable, ok=(200, 202, 409), what="cancel")
            else:
                choice = rng.random()
                if choice < 0.4:
                    resp = _call(http, "GET", f"/jobs/{rng.choice(mine)}", local, "get")
                    ok: tuple[int, ...] = (200,)
                elif choice < 0.7:
                    resp = _call(http, "GET", "/jobs?limit=20", local, "list")
                    ok = (200,)
                elif choice < 0.85:
                    resp = _call(http, "GET", "/jobs/analytics/queue", local, "analytics")
                    ok = (200,)
                else:
                    resp = _call(http, "GET", f"/jobs/{rng.choice(mine)}/analytics", local,
                                 "analytics")
                    ok = (200,)
                if resp is not None:
                    _judge(resp, local, allow_unavailable, ok=ok, what="read")
    stats.merge(local)


def _call(http: httpx.Client, method: str, url: str, stats: ClientStats, what: str,
          **kwargs: Any) -> httpx.Response | None:
    stats.sent[what] += 1
    try:
        resp = http.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        stats.statuses[f"{what}:{type(exc).__name__}"] += 1
        return None
    stats.statuses[f"{what}:{resp.status_code}"] += 1
    return resp


def _judge(resp: httpx.Response, stats: ClientStats, allow_unavailable: bool, *,
           ok: tuple[int, ...], what: str) -> None:
    if resp.status_code in ok:
        return
    if resp.status_code == 503 and allow_unavailable:
        return
    stats.problems.append(f"{what} {resp.request.method} {resp.request.url.path}: "
                          f"{resp.status_code} {resp.text[:200]}")


def _post_job(http: httpx.Client, body: dict[str, Any], idem: str | None, stats: ClientStats,
              allow_unavailable: bool, deadline: float) -> dict[str, Any] | None:
    headers = {"Idempotency-Key": idem} if idem else {}
    tries = 6 if idem else 1
    for attempt in range(tries):
        resp = _call(http, "POST", "/jobs", stats, "enqueue", json=body, headers=headers)
        if resp is not None and resp.status_code == 201:
            answer: dict[str, Any] = resp.json()
            return answer
        if resp is not None and not (resp.status_code == 503 and allow_unavailable):
            _judge(resp, stats, allow_unavailable, ok=(201,), what="enqueue")
            return None
        if not idem:
            break
        # Only a POST with an Idempotency-Key may be retried: the same key, the same job.
        time.sleep(min(2.0, 0.1 * 2 ** attempt))
        if time.monotonic() > deadline + 10:
            break
    stats.unacknowledged += 1
    return None


def run_clients(base: str, users: list[User], threads: int, seconds: float, max_requests: int,
                rng_seed: int, **kwargs: Any) -> tuple[ClientStats, list[threading.Thread]]:
    """Start `threads` client workers spread over users and keys; the caller joins them."""
    stats = ClientStats()
    deadline = time.monotonic() + seconds
    workers = []
    for i in range(threads):
        user = users[i % len(users)]
        key = user.keys[(i // len(users)) % len(user.keys)]
        t = threading.Thread(target=client_worker, name=f"rel-client-{i}",
                             args=(base, user, key, deadline, max_requests,
                                   random.Random(rng_seed * 1000 + i), stats), kwargs=kwargs)
        t.start()
        workers.append(t)
    return stats, workers


def join_all(threads: Iterable[threading.Thread], timeout: float) -> list[str]:
    """Join threads within one overall deadline; names of any still alive."""
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


# --- jobs finishing at random --------------------------------------------------------------------

FINISH_STATES = ("JOB_STATE_COMPLETED",) * 6 + ("JOB_STATE_FAILED",) * 2 + (
    "JOB_STATE_EARLY_STOPPED", "JOB_STATE_EXPIRED")


def finisher(sim: Simulator, stop: threading.Event, deadline: float, rng: random.Random,
             counts: Counter[str], *, every: float = 0.05, share: float = 0.2) -> None:
    """Ends a random share of the running provider jobs every `every` seconds."""
    rounds = 0
    while not stop.is_set() and time.monotonic() < deadline and rounds < 100_000:
        rounds += 1
        running = [j for j in sim.jobs() if j["state"] not in TERMINAL_STATES]
        for job in running:
            if rng.random() < share:
                state = rng.choice(FINISH_STATES)
                with suppress(KeyError, ValueError):  # deleted meanwhile by a cancel
                    sim.finish(job["sim"]["collection"], job["name"].rsplit("/", 1)[-1], state,
                               "finished by the test" if state != "JOB_STATE_COMPLETED" else None)
                    counts[state] += 1
        stop.wait(every)


# --- `sftq tick` as a child process --------------------------------------------------------------

def tick_env(db_url: str, sim_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FIREWORKS_", "SFTQ_", "DATABASE_URL", "SUPABASE_"))}
    env["PYTHONPATH"] = str(ROOT / "functions") + os.pathsep + env.get("PYTHONPATH", "")
    env.update({"DATABASE_URL": db_url, "FIREWORKS_BASE_URL": sim_url,
                "FIREWORKS_API_KEY": "x", "FIREWORKS_ACCOUNT_ID": ACCOUNT})
    env.update(extra)
    return env


def tick_command(holder: str, *, verbose: bool = False) -> list[str]:
    # The user's `sftq` command (the client CLI hands `tick` to the server CLI).
    return [sys.executable, "-m", "sftq_client", "tick", "--holder", holder,
            *(["-v"] if verbose else [])]


@dataclass
class KillStats:
    runs: int = 0
    killed: int = 0
    killed_mid_tick: int = 0
    exit_codes: Counter[int] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)


def run_tick_child(conn_url: str, env: dict[str, str], cwd: Path, holder: str,
                   rng: random.Random, stats: KillStats, out: Any, *, kill_rate: float,
                   timeout: float = 30.0) -> None:
    """One `sftq tick` child; with probability `kill_rate` it is SIGKILLed, half of those after
    it took the lease (mid-tick), the rest at a random moment (start-up included)."""
    child = subprocess.Popen(tick_command(holder), stdout=out, stderr=out, env=env, cwd=cwd)
    try:
        roll = rng.random()
        if roll < kill_rate / 2:
            deadline = time.monotonic() + timeout
            while child.poll() is None and time.monotonic() < deadline:
                if _holds_lease(conn_url, holder):
                    stats.count("killed_mid_tick")
                    time.sleep(rng.uniform(0.0, 0.3))
                    break
                time.sleep(0.01)
        elif roll < kill_rate:
            time.sleep(rng.uniform(0.0, 0.8))
        if roll < kill_rate and child.poll() is None:
            child.send_signal(signal.SIGKILL)
            stats.count("killed")
        code = child.wait(timeout)
        with stats.lock:
            stats.exit_codes[code] += 1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        stats.count("runs")


def _holds_lease(conn_url: str, holder: str) -> bool:
    try:
        with psycopg.connect(conn_url, autocommit=True, connect_timeout=2) as c:
            return c.execute("SELECT 1 FROM sftq.scheduler_ticks WHERE holder = %s",
                             (holder,)).fetchone() is not None
    except psycopg.Error:
        return False


# --- invariant checks: each returns the violations it found --------------------------------------

CAP_SQL = """
SELECT u.name, u.max_running, count(j.id) AS running, u.running_count
  FROM sftq.users u LEFT JOIN sftq.jobs j ON j.user_id = u.id AND j.state = 'PROGRESS'
 GROUP BY u.id
HAVING count(j.id) > u.max_running OR count(j.id) <> u.running_count
"""


def cap_violations(conn: Conn) -> list[str]:
    """No user has more PROGRESS jobs than their cap (and the counter admission reads agrees)."""
    return [f"user {name}: {running} running, cap {cap}, running_count {counter}"
            for name, cap, running, counter in conn.execute(CAP_SQL).fetchall()]


def gpu_violations(conn: Conn, quota: int) -> list[str]:
    """GPUs of PROGRESS jobs (what admission spends) never exceed the quota. The budget's
    floor (`ours_total`) makes this hold whatever the rule does with a lagging usage, so it
    checks the floor only; budget_violations and provider_quota_violations check the rule."""
    row = conn.execute("SELECT COALESCE(sum(gpu_count), 0) FROM sftq.jobs "
                       "WHERE state = 'PROGRESS'").fetchone()
    used = int(row[0]) if row else 0
    return [f"{used} GPUs in PROGRESS, quota {quota}"] if used > quota else []


# FIFO from the event log alone. For each 'admitted' event A (job J, event id e, A.at = the
# admitting transaction's start, taken before it waited for the exclusive gate), a job Q
# proves A out of order when all of these hold:
#   1. Q is earlier in FIFO order: (Q.created_at, Q.id) < (J.created_at, J.id);
#   2. Q was certainly committed and visible when A decided: Q.created_at < A.at. enqueue
#      takes clock_timestamp() while it holds the gate SHARED, so such an enqueue held the
#      gate before A could get it EXCLUSIVE, hence committed before A decided;
#   3. Q was still QUEUED then: its first event leaving QUEUED has an id above e (or it has
#      none). Every event that moves a job or frees a user is written under the gate, and A
#      holds it exclusively, so event ids order those changes exactly against A;
#   4. Q could have been admitted instead: Q belongs to J's own user (a user's jobs go in
#      order), or Q's user was below cap at e (their jobs whose PROGRESS interval, in event
#      ids, spans e) and had no job admitted earlier in the same admit call (same A.at).
# Sound (no false alarm) by 2-4; it can only miss a skipped job enqueued in the microseconds
# between A's start and its taking the gate. Users are never disabled in these tests.
LIFE_SQL = """
CREATE TEMP TABLE rel_life ON COMMIT DROP AS
SELECT j.id, j.user_id, j.created_at,
       min(e.id) FILTER (WHERE e.from_state = 'QUEUED') AS left_queue,
       min(e.id) FILTER (WHERE e.to_state = 'PROGRESS') AS run_from,
       min(e.id) FILTER (WHERE e.from_state = 'PROGRESS' AND e.to_state IS NOT NULL) AS run_to
  FROM sftq.jobs j LEFT JOIN sftq.job_events e ON e.job_id = j.id
 GROUP BY j.id;
CREATE INDEX ON rel_life (user_id, created_at, id);
CREATE TEMP TABLE rel_adm ON COMMIT DROP AS
SELECT e.id AS eid, e.at, j.id AS job_id, j.user_id, j.created_at
  FROM sftq.job_events e JOIN sftq.jobs j ON j.id = e.job_id
 WHERE e.event = 'admitted';
CREATE INDEX ON rel_adm (user_id, at);
ANALYZE rel_life;
ANALYZE rel_adm;
"""
FIFO_SQL = """
WITH per_user AS (
    SELECT a.eid, a.job_id, a.user_id AS a_user, a.created_at AS a_created, a.at,
           u.id AS q_user, u.max_running,
           (SELECT count(*) FROM rel_life r WHERE r.user_id = u.id AND r.run_from < a.eid
              AND (r.run_to IS NULL OR r.run_to > a.eid)) AS running,
           EXISTS (SELECT 1 FROM rel_adm b WHERE b.user_id = u.id AND b.at = a.at
                     AND b.eid < a.eid) AS admitted_same_call
      FROM rel_adm a CROSS JOIN sftq.users u
     WHERE a.eid > %(since)s
)
SELECT p.job_id, p.eid, q.id, q.user_id = p.a_user AS same_user, p.running, p.max_running
  FROM per_user p
  JOIN LATERAL (
        SELECT l.id, l.user_id FROM rel_life l
         WHERE l.user_id = p.q_user
           AND (l.created_at, l.id) < (p.a_created, p.job_id)
           AND l.created_at < p.at
           AND (l.left_queue IS NULL OR l.left_queue > p.eid)
         ORDER BY l.created_at, l.id LIMIT 1) q ON true
 WHERE p.q_user = p.a_user
    OR (p.running < p.max_running AND NOT p.admitted_same_call)
 ORDER BY p.eid
"""


def fifo_violations(conn: Conn, since_event_id: int = 0) -> tuple[list[str], int]:
    """Admissions out of FIFO order, from the event log (FIFO_SQL), for 'admitted' events
    with an id above `since_event_id`; and the highest such id seen (the next `since`)."""
    with conn.transaction():
        # One snapshot for everything read: a job leaving the queue between two reads must
        # not look as if it were still waiting.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        top = counts(conn, "SELECT COALESCE(max(id), 0) FROM sftq.job_events "
                           "WHERE event = 'admitted'")
        if top <= since_event_id:
            return [], since_event_id
        conn.execute(LIFE_SQL)
        rows = conn.execute(FIFO_SQL, {"since": since_event_id}).fetchall()
    found = [f"admitted {job} (event {eid}) while {q} waited"
             f"{' (same user)' if same else f' (its user ran {running} of {cap})'}"
             for job, eid, q, same, running, cap in rows]
    return found, int(top)


# The exact check, run by the database itself: a trigger on every 'admitted' event looks at
# the queue from inside the admitting transaction, which holds the admission gate EXCLUSIVE,
# so nothing can change under it. It records violations instead of raising, so the run goes
# on and the test reports them all. Installed only into a test's own database.
ORACLE_SQL = """
CREATE SCHEMA IF NOT EXISTS reltest;
CREATE TABLE IF NOT EXISTS reltest.fifo_violations (
    admitted uuid, skipped uuid, same_user boolean, seen_at timestamptz DEFAULT clock_timestamp());
CREATE OR REPLACE FUNCTION reltest.check_admission() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_job sftq.jobs;
BEGIN
    SELECT * INTO v_job FROM sftq.jobs WHERE id = NEW.job_id;
    INSERT INTO reltest.fifo_violations (admitted, skipped, same_user)
    SELECT NEW.job_id, q.id, q.user_id = v_job.user_id
      FROM sftq.jobs q JOIN sftq.users u ON u.id = q.user_id
     WHERE q.state = 'QUEUED'
       AND (q.created_at, q.id) < (v_job.created_at, v_job.id)
       AND (q.user_id = v_job.user_id
            OR (u.disabled_at IS NULL
                AND (SELECT count(*) FROM sftq.jobs r
                      WHERE r.user_id = u.id AND r.state = 'PROGRESS') < u.max_running
                AND NOT EXISTS (
                    SELECT 1 FROM sftq.job_events e JOIN sftq.jobs a ON a.id = e.job_id
                     WHERE e.event = 'admitted' AND a.user_id = u.id AND e.id < NEW.id
                       AND e.xmin::text = (pg_current_xact_id()::xid)::text)))
     ORDER BY q.created_at, q.id
     LIMIT 3;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS reltest_fifo ON sftq.job_events;
CREATE TRIGGER reltest_fifo AFTER INSERT ON sftq.job_events
    FOR EACH ROW WHEN (NEW.event = 'admitted') EXECUTE FUNCTION reltest.check_admission();
"""


def install_fifo_oracle(conn: Conn) -> None:
    conn.execute(ORACLE_SQL)


def oracle_violations(conn: Conn) -> list[str]:
    rows = conn.execute("SELECT admitted, skipped, same_user FROM reltest.fifo_violations "
                        "ORDER BY seen_at").fetchall()
    return [f"admitted {a} while {s} waited{' (same user)' if same else ''} (in-transaction)"
            for a, s, same in rows]


# The GPU budget as the contract promises it, checked by the database itself at every
# admission: our PROGRESS GPUs (this admission included; the admitting transaction holds the
# gate EXCLUSIVE, so no job can end or start under it) plus the provider's true external
# usage at that moment never exceed min(value, maxValue). The test moves external usage
# only between ticks, and writes the value it gave the simulator to reltest.provider_truth
# while no tick runs, so "at that moment" is exact. Like the FIFO oracle, it records instead
# of raising. Exact while the provider's usage never shows one of our jobs (every job not
# yet counted is one the rule must add on top): run_load keeps the lag above the run's length.
BUDGET_ORACLE_SQL = """
CREATE SCHEMA IF NOT EXISTS reltest;
CREATE TABLE IF NOT EXISTS reltest.provider_truth (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    quota_limit integer NOT NULL,
    external numeric NOT NULL);
CREATE TABLE IF NOT EXISTS reltest.budget_violations (
    admitted uuid, ours integer, external numeric, quota_limit integer,
    seen_at timestamptz DEFAULT clock_timestamp());
CREATE OR REPLACE FUNCTION reltest.check_budget() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO reltest.budget_violations (admitted, ours, external, quota_limit)
    SELECT NEW.job_id, o.ours, p.external, p.quota_limit
      FROM reltest.provider_truth p,
           (SELECT COALESCE(sum(j.gpu_count), 0)::int AS ours
              FROM sftq.jobs j WHERE j.state = 'PROGRESS') o
     WHERE o.ours + p.external > p.quota_limit;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS reltest_budget ON sftq.job_events;
CREATE TRIGGER reltest_budget AFTER INSERT ON sftq.job_events
    FOR EACH ROW WHEN (NEW.event = 'admitted') EXECUTE FUNCTION reltest.check_budget();
"""


def install_budget_oracle(conn: Conn, quota_limit: int) -> None:
    conn.execute(BUDGET_ORACLE_SQL)
    conn.execute("INSERT INTO reltest.provider_truth (quota_limit, external) VALUES (%s, 0) "
                 "ON CONFLICT (only_row) DO UPDATE SET quota_limit = EXCLUDED.quota_limit, "
                 "external = 0", (quota_limit,))


def set_true_external(conn: Conn, external: float) -> None:
    """The external usage the simulator was just given, for the budget oracle (between
    ticks only)."""
    conn.execute("UPDATE reltest.provider_truth SET external = %s", (external,))


def budget_violations(conn: Conn) -> list[str]:
    rows = conn.execute("SELECT admitted, ours, external, quota_limit "
                        "FROM reltest.budget_violations ORDER BY seen_at").fetchall()
    return [f"admitted {a}: {ours} GPUs of ours in PROGRESS + {ext:g} external > {limit}"
            for a, ours, ext, limit in rows]


def provider_quota_violations(sim: Simulator) -> list[str]:
    """No create reached the simulator when its quota had no room for it at the account's
    true usage (what Fireworks would refuse with 429 quota_exceeded)."""
    over = int(sim.quota()["over_quota_creates"])
    return [f"{over} create{'s' if over > 1 else ''} found no room in the quota at the "
            "provider's true usage"] if over else []


LEGAL = {("QUEUED", "PROGRESS"), ("QUEUED", "CANCELLED"), ("PROGRESS", "SUCCESS"),
         ("PROGRESS", "FAIL"), ("PROGRESS", "CANCELLED")}


def transition_violations(conn: Conn) -> list[str]:
    """Every job's transitions, read from its events, form one legal path from QUEUED to its
    current state."""
    rows = conn.execute("""
        SELECT j.id, j.state,
               COALESCE(array_agg(e.from_state || '>' || e.to_state ORDER BY e.id)
                        FILTER (WHERE e.to_state IS NOT NULL), '{}')
          FROM sftq.jobs j LEFT JOIN sftq.job_events e ON e.job_id = j.id
         GROUP BY j.id""").fetchall()
    bad = []
    for job_id, state, moves in rows:
        at = "QUEUED"
        for move in moves:
            frm, to = move.split(">")
            if frm != at or (frm, to) not in LEGAL:
                bad.append(f"job {job_id}: {' '.join(moves)}")
                break
            at = to
        else:
            if at != state:
                bad.append(f"job {job_id}: events end at {at}, row says {state}")
    return bad


def created_once_violations(conn: Conn, sim: FaultySim, *, final: bool) -> list[str]:
    """Every provider job is created at most once (from the simulator's answers); at the end,
    every job we recorded as submitted was created exactly once, under its own derived id."""
    created = sim.created_ok()
    bad = [f"{p} created {n} times" for p, n in created.items() if n > 1]
    if final:
        ours = {pid(r[0]): r[1] for r in conn.execute(
            "SELECT id, submitted_at IS NOT NULL FROM sftq.jobs").fetchall()}
        bad += [f"{p} created but not one of our jobs" for p in created if p not in ours]
        bad += [f"{p} submitted but created {created[p]} times"
                for p, submitted in ours.items() if submitted and created[p] != 1]
    return bad


def lost_violations(conn: Conn, accepted: dict[str, str]) -> list[str]:
    """Every POST answered 201 is a row of the user it was answered to."""
    rows = dict(conn.execute("SELECT j.id::text, u.name FROM sftq.jobs j "
                             "JOIN sftq.users u ON u.id = j.user_id").fetchall())
    return [f"job {j} (201 to {u}) is {'missing' if j not in rows else 'owned by ' + rows[j]}"
            for j, u in accepted.items() if rows.get(j) != u]


STUCK_SQL = """
SELECT j.id, j.started_at FROM sftq.jobs j
 WHERE j.state = 'PROGRESS' AND j.submitted_at IS NULL AND j.cancel_requested_at IS NULL
   AND j.last_submit_error IS NULL
   AND NOT EXISTS (SELECT 1 FROM sftq.job_events e
                    WHERE e.job_id = j.id AND e.event = 'submit_retry')
"""


def stuck_violations(conn: Conn) -> list[str]:
    """A PROGRESS job is submitted, or shows why not (last_submit_error, a submit_retry event,
    or a cancel it is waiting to finish)."""
    return [f"job {j} PROGRESS since {at}, never submitted, no reason recorded"
            for j, at in conn.execute(STUCK_SQL).fetchall()]


def orphan_violations(conn: Conn, sim: Simulator) -> list[str]:
    """No provider job keeps running for a job that is over (or unknown) on our side."""
    states = {pid(r[0]): r[1] for r in conn.execute("SELECT id, state FROM sftq.jobs").fetchall()}
    bad = []
    for job in sim.jobs():
        provider_id = job["name"].rsplit("/", 1)[-1]
        if job["state"] not in TERMINAL_STATES and states.get(provider_id) != "PROGRESS":
            bad.append(f"{provider_id} runs at the provider, ours is {states.get(provider_id)}")
    return bad


def counts(conn: Conn, sql: str, *params: Any) -> Any:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


@contextmanager
def connect(url: str) -> Iterator[Conn]:
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as c:
        yield c


def mini_faults(db_url: str, make_sim: Any, *, users: int = 6, lost_rate: float = 0.0,
                failing_creates: Callable[[int], int] | None = None, ticks: int = 4,
                later_users: int = 0) -> tuple[Any, list[uuid.UUID]]:
    """Users with one SFT job each (in FIFO order); creates may lose their answer (applied,
    then timed out) or fail with a 503 the first `failing_creates(i)` times for job i; then
    in-process ticks with a small client timeout; `later_users` more users enqueue a job each
    after the first tick. The simulator and the jobs."""
    from sftq_server.db import Database
    from sftq_server.provider import FireworksClient
    from sftq_server.scheduler.tick import run_tick

    sim, server = make_sim(job_seconds=0, max_value=64, lost_rate=lost_rate, lost_seconds=0.6,
                           rng_seed=4)
    settings = rel_settings(db_url, server.url, fireworks_timeout_seconds=0.3)
    jobs: list[uuid.UUID] = []

    def enqueue(conn: Conn, new_users: list[User]) -> None:
        for user in new_users:
            row = conn.execute("SELECT id FROM sftq.enqueue(%s, 'SFT', %s::jsonb)",
                               (user.id, json.dumps(payload("SFT")))).fetchone()
            assert row is not None
            fails = failing_creates(len(jobs)) if failing_creates else 0
            jobs.append(row[0])
            if fails:
                sim.rules[pid(row[0])] = lambda op, n, fails=fails: \
                    "503" if op == "create" and n < fails else None

    with connect(db_url) as conn:
        enqueue(conn, make_users(conn, users))
    db = Database(db_url, max_size=2, timeout=5.0)
    try:
        with FireworksClient(base_url=server.url, api_key=FW_KEY, account_id=ACCOUNT,
                             timeout=0.3) as provider:
            for n in range(ticks):
                run_tick(db, provider, settings, holder="mini")
                if n == 0 and later_users:
                    with connect(db_url) as conn:
                        enqueue(conn, make_users(conn, later_users, prefix="later"))
    finally:
        db.close()
    return sim, jobs
