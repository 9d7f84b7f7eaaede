"""Security probes, shared by the security tests and by the break-on-purpose tests. Each
returns what it found wrong (an empty list when the property holds), so a deliberately
broken system shows which probe objects and why."""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from rel_support import (
    FW_KEY,
    PAYLOAD_SECRETS,
    TICK_SECRET,
    WANDB_SECRET,
    Conn,
    User,
    connect,
    make_users,
    payload,
    pid,
    rel_settings,
    tick_command,
    tick_env,
)

from sftq_server.db import Database
from sftq_server.dev.pgcluster import free_port
from sftq_server.provider import FireworksClient
from sftq_server.scheduler.tick import run_tick

JOBS = "/functions/v1/jobs-api"
ANALYTICS = "/functions/v1/analytics"
STATES = ("SUCCESS", "FAIL", "PROGRESS", "QUEUED", "CANCELLED")


def envelope_problem(status: int, content_type: str | None, body: bytes) -> str | None:
    """None when an answer is acceptable: below 500, and an error is the documented envelope
    {"error": str, "code": str} (plus optional "details")."""
    if status >= 500:
        return f"HTTP {status}"
    if status < 400:
        return None
    if not (content_type or "").startswith("application/json"):
        return f"HTTP {status} with Content-Type {content_type!r}"
    try:
        data = json.loads(body)
    except ValueError:
        return f"HTTP {status} body is not JSON: {body[:80]!r}"
    if not (isinstance(data, dict) and isinstance(data.get("error"), str) and data["error"]
            and isinstance(data.get("code"), str) and set(data) <= {"error", "code", "details"}):
        return f"HTTP {status} body is not the envelope: {data!r:.120}"
    return None


# --- a small world: three users, each with a job in every state ----------------------------------

@dataclass
class World:
    db_url: str
    base: str  # the served gateway
    users: list[User]
    jobs: dict[str, dict[str, str]]  # user name -> state -> job id
    sim: Any
    sim_url: str
    settings: Any
    bodies: list[bytes] = field(default_factory=list)  # every API answer seen, for leak checks

    def key(self, name: str) -> str:
        return next(u.keys[0] for u in self.users if u.name == name)


def build_world(db_url: str, make_sim: Any, make_gateway: Any, *, faults: bool = True) -> World:
    """Users alice, bob and carol, each with one job SUCCESS, FAIL (payload rejected by the
    provider), PROGRESS (submitted), QUEUED and CANCELLED, made through the API and real
    ticks; with `faults`, some submissions first fail transiently (submit_retry events)."""
    sim, sim_server = make_sim(job_seconds=0, max_value=64)
    settings = rel_settings(db_url, sim_server.url, tick_lease_seconds=5.0)
    gateway = make_gateway(settings)
    with connect(db_url) as conn:
        users = make_users(conn, 3, keys_per_user=2, names=["alice", "bob", "carol"])
    world = World(db_url, gateway.url, users, {u.name: {} for u in users}, sim, sim_server.url,
                  settings)
    db = Database(db_url, max_size=2, timeout=5.0)
    try:
        with httpx.Client(base_url=gateway.url, timeout=10) as http, \
                FireworksClient(base_url=sim_server.url, api_key=FW_KEY, account_id="sim-account",
                                timeout=2.0) as provider:
            def post(user: User, kind: str, valid: bool = True) -> str:
                resp = http.post(f"{JOBS}/jobs", headers=_auth(user.keys[0]),
                                 json={"kind": kind, "display_name": f"{user.name}-{kind}",
                                       "fireworks_payload": payload(kind, valid=valid)})
                world.bodies.append(resp.content)
                assert resp.status_code == 201, resp.text
                return str(resp.json()["id"])

            def tick() -> None:
                result = run_tick(db, provider, settings, holder="world")
                assert result["status"] in ("ok", "error"), result

            first = {u.name: post(u, "SFT") for u in users}
            if faults:
                # The first create of each fails: submit_retry events carry the provider's
                # answer, and the next tick submits under the same id.
                for job in first.values():
                    sim.rules[pid(job)] = lambda op, n: "503" if op == "create" and n == 0 \
                        else None
                tick()
            tick()
            for u in users:
                sim.finish("SFT", pid(first[u.name]), "JOB_STATE_COMPLETED")
            tick()
            rejected = {u.name: post(u, "DPO", valid=False) for u in users}
            tick()
            running = {u.name: post(u, "RFT") for u in users}
            tick()
            queued = {u.name: post(u, "SFT") for u in users}
            cancelled = {u.name: post(u, "DPO") for u in users}
            for u in users:
                resp = http.delete(f"{JOBS}/jobs/{cancelled[u.name]}", headers=_auth(u.keys[0]))
                world.bodies.append(resp.content)
                assert resp.status_code == 200, resp.text
                world.jobs[u.name] = {"SUCCESS": first[u.name], "FAIL": rejected[u.name],
                                      "PROGRESS": running[u.name], "QUEUED": queued[u.name],
                                      "CANCELLED": cancelled[u.name]}
    finally:
        db.close()
    with connect(db_url) as conn:
        for name, by_state in world.jobs.items():
            for state, job in by_state.items():
                row = conn.execute("SELECT state FROM sftq.jobs WHERE id = %s", (job,)).fetchone()
                assert row is not None and row[0] == state, (name, state, row)
    return world


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _snapshot(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT j.id, j.state, j.cancel_requested_at, "
                        "(SELECT count(*) FROM sftq.job_events e WHERE e.job_id = j.id) "
                        "FROM sftq.jobs j ORDER BY j.id").fetchall()


# --- another user's job is 404 -------------------------------------------------------------------

def cross_user_problems(world: World) -> tuple[list[str], int]:
    """Every user tries GET, DELETE and analytics (both functions) on every other user's job
    in every state: each answer must be exactly the answer for an id that does not exist,
    nothing may change, and lists and queue context show only one's own jobs."""
    problems: list[str] = []
    probes = 0
    with connect(world.db_url) as conn:
        before = _snapshot(conn)
    routes = [("GET", JOBS + "/jobs/{id}"), ("DELETE", JOBS + "/jobs/{id}"),
              ("GET", JOBS + "/jobs/{id}/analytics"), ("GET", ANALYTICS + "/jobs/{id}/analytics")]
    with httpx.Client(base_url=world.base, timeout=10) as http:
        for viewer in world.users:
            headers = _auth(viewer.keys[1])
            for method, template in routes:
                nobody = http.request(method, template.format(id=uuid.uuid4()), headers=headers)
                if nobody.status_code != 404:
                    problems.append(f"{method} {template} unknown id: {nobody.status_code}")
                for owner, by_state in world.jobs.items():
                    if owner == viewer.name:
                        continue
                    for state, job in by_state.items():
                        resp = http.request(method, template.format(id=job), headers=headers)
                        probes += 1
                        world.bodies.append(resp.content)
                        if (resp.status_code, resp.content) != (nobody.status_code,
                                                                 nobody.content):
                            problems.append(f"{viewer.name}: {method} {template} on {owner}'s "
                                            f"{state} job: {resp.status_code} {resp.text[:120]}")
                        elif set(resp.headers) != set(nobody.headers):
                            problems.append(f"{viewer.name}: {method} {template}: headers differ")
            mine = set(world.jobs[viewer.name].values())
            listed = http.get(f"{JOBS}/jobs?limit=1000", headers=headers)
            context = http.get(f"{JOBS}/jobs/analytics/queue", headers=headers)
            world.bodies += [listed.content, context.content]
            shown = {j["id"] for j in listed.json()}
            shown |= {j["id"] for j in context.json()["your_queued_jobs"]}
            running = context.json()["your_progress_job"]
            shown |= {running["id"]} if running else set()
            if shown - mine:
                problems.append(f"{viewer.name} sees jobs that are not theirs: {shown - mine}")
    with connect(world.db_url) as conn:
        if _snapshot(conn) != before:
            problems.append("a request on another user's job changed something")
    return problems, probes


# --- revoked and malformed keys ------------------------------------------------------------------

MALFORMED = ["", "sftq_", "sftq_short", "SFTQ_" + "a" * 48, "sk_" + "a" * 48, "sftq_" + "é" * 48,
             "sftq_" + "a" * 24 + " " + "a" * 23, "sftq_" + "a" * 48 + "\x00", "sftq_" + "a" * 300,
             "Bearer sftq_" + "a" * 48, "' OR 1=1 --", "sftq_../../etc/passwd"]


def bad_key_problems(world: World) -> tuple[list[str], int]:
    """Revoked keys, a disabled user's keys, unknown and malformed keys get 401 on every
    authenticated route, with the same answer whether or not the key ever existed; the
    revoked key worked before, and the user's other key still works."""
    problems: list[str] = []
    alice, bob = world.users[0], world.users[1]
    routes = [("POST", JOBS + "/jobs"), ("GET", JOBS + "/jobs"), ("GET", JOBS + "/jobs/{id}"),
              ("DELETE", JOBS + "/jobs/{id}"), ("GET", JOBS + "/jobs/{id}/analytics"),
              ("GET", JOBS + "/jobs/analytics/queue"), ("GET", JOBS + "/jobs/analytics/summary"),
              ("GET", ANALYTICS + "/jobs/analytics/summary"),
              ("GET", ANALYTICS + "/jobs/{id}/analytics")]
    body = {"kind": "SFT", "fireworks_payload": payload("SFT")}
    probes = 0
    with httpx.Client(base_url=world.base, timeout=10) as http:
        def call(key: str, method: str, template: str, job: str) -> httpx.Response:
            kwargs: dict[str, Any] = {"json": body} if method == "POST" else {}
            return http.request(method, template.format(id=job), headers=_auth(key), **kwargs)

        revoked = alice.keys[0]
        if call(revoked, "GET", JOBS + "/jobs", "").status_code != 200:
            problems.append("alice's key did not work before it was revoked")
        with connect(world.db_url) as conn:
            conn.execute("SELECT sftq.revoke_key(%s)", (revoked,))
            conn.execute("SELECT sftq.set_user_disabled(%s, true)", (bob.name,))
        unknown = "sftq_" + "".join(random.Random(5).choice("0123456789abcdef") for _ in range(48))
        cases = {"revoked": revoked, "disabled user": bob.keys[0], "unknown": unknown,
                 **{f"malformed {k!r:.20}": k for k in MALFORMED}}
        same_answer: dict[str, set[bytes]] = {}
        for label, key in cases.items():
            for method, template in routes:
                job = world.jobs["alice"]["QUEUED"]
                try:
                    resp = call(key, method, template, job)
                except (httpx.LocalProtocolError, UnicodeEncodeError):
                    continue  # a header value no client can send
                probes += 1
                world.bodies.append(resp.content)
                problem = envelope_problem(resp.status_code, resp.headers.get("content-type"),
                                           resp.content)
                if resp.status_code != 401 or problem:
                    problems.append(f"{label}: {method} {template}: {resp.status_code} "
                                    f"{resp.text[:100]}")
                elif resp.headers.get("www-authenticate", "").lower() != "bearer":
                    problems.append(f"{label}: {method} {template}: no WWW-Authenticate")
                if label in ("revoked", "disabled user", "unknown"):
                    same_answer.setdefault(f"{method} {template}", set()).add(resp.content)
        for route, answers in same_answer.items():
            if len(answers) != 1:
                problems.append(f"{route}: revoked, disabled and unknown keys answer differently")
        if call(alice.keys[1], "GET", JOBS + "/jobs", "").status_code != 200:
            problems.append("alice's other key stopped working")
    return problems, probes


# --- key lookup timing ---------------------------------------------------------------------------

@dataclass
class Timing:
    rounds: int
    medians_us: dict[str, float]
    shift_us: float  # median of the paired differences: 40 chars shared - 0 shared
    shift_se_us: float
    control_us: float  # the same, between two keys that share nothing
    limit_us: float

    @property
    def leaks(self) -> bool:
        return abs(self.shift_us) > self.limit_us


def _se_of_median(values: list[float]) -> float:
    # The MAD, scaled to a standard deviation (x 1.4826), times the standard error of a median
    # for normal data (x 1.2533 / sqrt(n)): robust to the long tail of scheduler hiccups.
    m = statistics.median(values)
    mad = statistics.median(abs(v - m) for v in values)
    return float(1.4826 * mad * 1.2533 / len(values) ** 0.5)


def key_variant(key: str, shared: int, rng: random.Random) -> str:
    """A well-formed key whose secret part (after "sftq_") shares exactly its first `shared`
    characters with `key`'s."""
    secret = key[5:]
    rest = []
    for i, ch in enumerate(secret[shared:]):
        # The first character after the shared part must differ; the rest are random.
        rest.append(rng.choice("0123456789abcdef".replace(ch, "") if i == 0
                               else "0123456789abcdef"))
    return "sftq_" + secret[:shared] + "".join(rest)


def measure_key_lookup(client: Any, real_key: str, rounds: int, *, seed: int = 3) -> Timing:
    """Time many refused lookups of well-formed keys sharing 0 and 40 leading characters of
    the secret part with a real key (a key that does not start with "sftq_" is refused before
    any lookup, so the 5 public characters are always shared). Each round times the three
    keys in a random order, so drift in the machine's speed cancels in the per-round
    differences; the statistic is the median of those differences against a limit of
    max(5 standard errors (from the MAD), 20 microseconds), with a control pair of two keys
    that share nothing."""
    rng = random.Random(seed)
    keys = {"shared0": key_variant(real_key, 0, rng), "shared40": key_variant(real_key, 40, rng),
            "control": key_variant(real_key, 0, rng)}
    samples: dict[str, list[float]] = {name: [] for name in keys}

    def once(key: str) -> float:
        started = time.perf_counter_ns()
        resp = client.get(f"{JOBS}/jobs/analytics/summary", headers=_auth(key))
        elapsed = (time.perf_counter_ns() - started) / 1000
        assert resp.status_code == 401, resp.status_code
        return elapsed

    for _ in range(min(100, rounds)):  # warm up caches, the pool, the plan
        for key in keys.values():
            once(key)
    order = list(keys.items())
    # No garbage collection pauses inside the measurement (they land on whichever key).
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            rng.shuffle(order)
            for name, key in order:
                samples[name].append(once(key))
    finally:
        gc.enable()
    shift = [a - b for a, b in zip(samples["shared40"], samples["shared0"], strict=True)]
    control = [a - b for a, b in zip(samples["control"], samples["shared0"], strict=True)]
    se = _se_of_median(shift)
    return Timing(rounds, {k: round(statistics.median(v), 1) for k, v in samples.items()},
                  round(statistics.median(shift), 2), round(se, 2),
                  round(statistics.median(control), 2), round(max(5 * se, 20.0), 2))


# --- the tick endpoint ---------------------------------------------------------------------------

def tick_secret_problems(world: World) -> tuple[list[str], int]:
    """The scheduler-tick function refuses a missing or wrong secret (401, nothing run: no tick
    row, no provider call) and other methods (405); the right secret runs a tick."""
    problems: list[str] = []
    url = "/functions/v1/scheduler-tick"
    wrong = [None, "", "Bearer", "Bearer ", f"Bearer {TICK_SECRET[:-1]}",
             f"Bearer {TICK_SECRET}x", f"Bearer {TICK_SECRET.upper()}", f"Bearer {TICK_SECRET[:8]}",
             f"Basic {TICK_SECRET}", TICK_SECRET, f"Bearer {TICK_SECRET} {TICK_SECRET}",
             f"Bearer {world.users[0].keys[1]}", "Bearer ' OR 1=1 --"]
    with connect(world.db_url) as conn:
        ticks_before = conn.execute("SELECT count(*) FROM sftq.scheduler_ticks").fetchone()
    calls_before = len(world.sim.requests())
    probes = 0
    with httpx.Client(base_url=world.base, timeout=30) as http:
        for auth in wrong:
            headers = {} if auth is None else {"Authorization": auth}
            for extra in ({}, {"params": {"secret": TICK_SECRET}},
                          {"json": {"secret": TICK_SECRET}}):
                try:
                    resp = http.post(url, headers=headers, **extra)  # type: ignore[arg-type]
                except httpx.LocalProtocolError:
                    break  # a header value no client can send (trailing space)
                probes += 1
                problem = envelope_problem(resp.status_code, resp.headers.get("content-type"),
                                           resp.content)
                if resp.status_code != 401 or problem:
                    problems.append(f"tick with {auth!r:.30} {list(extra)}: {resp.status_code}")
        for method in ("GET", "PUT", "DELETE"):
            resp = http.request(method, url, headers={"Authorization": f"Bearer {TICK_SECRET}"})
            probes += 1
            if resp.status_code != 405:
                problems.append(f"tick {method}: {resp.status_code}")
        with connect(world.db_url) as conn:
            ticks_after = conn.execute("SELECT count(*) FROM sftq.scheduler_ticks").fetchone()
        if ticks_after != ticks_before or len(world.sim.requests()) != calls_before:
            problems.append("a refused tick ran anyway")
        resp = http.post(url, headers={"Authorization": f"bearer {TICK_SECRET}"})
        if resp.status_code != 200 or resp.json().get("status") not in ("ok", "error"):
            problems.append(f"the right secret did not run a tick: {resp.status_code}")
    return problems, probes


# --- what analysts and API callers can read ------------------------------------------------------

def needles(db_url: str, users: Iterable[User]) -> dict[str, str]:
    """Every secret that must never be shown: payload secrets, API keys and their stored
    hashes (hex), the Fireworks key and the tick secret."""
    found = {f"payload secret {i}": s for i, s in enumerate(PAYLOAD_SECRETS)}
    found |= {"fireworks key": FW_KEY, "tick secret": TICK_SECRET}
    for user in users:
        for i, key in enumerate(user.keys):
            found[f"{user.name} key {i}"] = key
            found[f"{user.name} key {i} beyond its prefix"] = key[13:]
            found[f"{user.name} key {i} hash"] = hashlib.sha256(key.encode()).hexdigest()
    with connect(db_url) as conn:
        for (hex_hash,) in conn.execute("SELECT encode(key_hash, 'hex') FROM sftq.api_keys"):
            found[f"stored hash {hex_hash[:8]}"] = hex_hash
    return found


def leaks(texts: dict[str, str], secrets: dict[str, str]) -> list[str]:
    return [f"{what} appears in {where}" for where, text in texts.items()
            for what, secret in secrets.items() if secret and secret in text]


ANALYST_VIEWS = ("analyst_jobs", "analyst_job_events", "analyst_ticks", "analyst_users",
                 "analyst_queue", "analyst_daily")


def analyst_problems(world: World) -> tuple[list[str], int]:
    """As sftq_analyst: every row of every analyst view (payloads, events with the provider's
    answers, tick errors) holds no key, key hash or payload secret; the tables that hold them
    are out of reach. The static grants are tests/sql/test_analyst_role.py."""
    problems: list[str] = []
    texts: dict[str, str] = {}
    secrets = needles(world.db_url, world.users)
    rows = 0
    with psycopg.connect(world.db_url, autocommit=True) as conn:
        conn.execute("SET ROLE sftq_analyst")
        try:
            for view in ANALYST_VIEWS:
                dumped = conn.execute(f"SELECT row_to_json(v)::text FROM sftq.{view} v").fetchall()
                rows += len(dumped)
                texts[f"sftq.{view}"] = "\n".join(r[0] for r in dumped)
            for forbidden in ("SELECT key_hash FROM sftq.api_keys",
                              "SELECT fireworks_payload FROM sftq.jobs"):
                try:
                    conn.execute(forbidden)
                    problems.append(f"the analyst may run: {forbidden}")
                except psycopg.errors.InsufficientPrivilege:
                    pass
        finally:
            conn.execute("RESET ROLE")
    if "[REDACTED]" not in texts["sftq.analyst_jobs"]:
        problems.append("analyst_jobs shows no redacted payload at all")
    problems += leaks(texts, secrets)
    problems += leaks({"API answers": "\n".join(b.decode("utf-8", "replace")
                                                for b in world.bodies)}, secrets)
    return problems, rows


# --- logs ---------------------------------------------------------------------------------------

def capture_every_logger(caplog: pytest.LogCaptureFixture) -> None:
    """DEBUG for the root and every logger that set its own level; loggers that do not
    propagate get the capture handler directly."""
    caplog.set_level(logging.DEBUG)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            if logger.level != logging.NOTSET:
                caplog.set_level(logging.DEBUG, logger=name)
            if not logger.propagate and caplog.handler not in logger.handlers:
                logger.addHandler(caplog.handler)


def log_scenario(db_url: str, make_sim: Any, make_gateway: Any, tmp_path: Path, *,
                 children: bool = True) -> tuple[dict[str, str], dict[str, str]]:
    """A run that goes through every path that logs: the world (API, ticks with provider
    failures, a rejected payload, cancels), cross-user and bad-key probes, a tick over HTTP,
    refused bodies that carry a secret, `sftq tick -v` and a served gateway as child
    processes. Returns the child processes' output and the secrets to search for."""
    world = build_world(db_url, make_sim, make_gateway)
    cross_user_problems(world)
    bad_key_problems(world)
    key = world.users[2].keys[0]
    with httpx.Client(base_url=world.base, timeout=30) as http:
        for raw in (b'{"kind": "SFT", "fireworks_payload": {"wandbConfig": {"apiKey": "'
                    + WANDB_SECRET.encode() + b'"',
                    b'{"kind": "SFT", "fireworks_payload": {}, "display_name": "'
                    + WANDB_SECRET.encode() * 20 + b'"}',
                    b'{"kind": "XX", "fireworks_payload": {"apiKey": "' + WANDB_SECRET.encode()
                    + b'"}}'):
            http.post(f"{JOBS}/jobs", content=raw, headers={
                "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        http.post("/functions/v1/scheduler-tick",
                  headers={"Authorization": f"Bearer {TICK_SECRET}"})
        resp = http.post(f"{JOBS}/jobs", headers={"Authorization": f"Bearer {key}"},
                         json={"kind": "SFT", "fireworks_payload": payload("SFT")})
        assert resp.status_code == 201

    outputs: dict[str, str] = {}
    if not children:
        return outputs, needles(db_url, world.users)
    world.sim.set_faults(error_rate=0.5, statuses=[500, 503, 429])
    env = tick_env(db_url, world.sim_url, FIREWORKS_API_KEY=FW_KEY, FIREWORKS_TIMEOUT="2")
    for i in range(3):
        done = subprocess.run(tick_command(f"logs-{i}", verbose=True), env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        outputs[f"sftq tick -v #{i}"] = done.stdout + done.stderr
    world.sim.set_faults()
    outputs["served gateway"] = _served_gateway_output(db_url, world.sim_url, key, tmp_path)
    return outputs, needles(db_url, world.users)


def _served_gateway_output(db_url: str, sim_url: str, key: str, cwd: Path) -> str:
    """`python -m sftq_server.http.gateway` as deployed, logging to stderr; a few requests that log
    (an enqueue with secrets, a refused key, a wrong and a right tick secret, a cancel)."""
    port = free_port()
    env = tick_env(db_url, sim_url, FIREWORKS_API_KEY=FW_KEY, SFTQ_TICK_SECRET=TICK_SECRET)
    child = subprocess.Popen([sys.executable, "-m", "sftq_server.http.gateway",
                              "--port", str(port)],
                             env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        for _ in range(300):
            try:
                httpx.get(f"{base}{JOBS}/health", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with httpx.Client(base_url=base, timeout=30) as http:
            made = http.post(f"{JOBS}/jobs", headers={"Authorization": f"Bearer {key}"},
                             json={"kind": "RFT", "fireworks_payload": payload("RFT")})
            http.get(f"{JOBS}/jobs", headers={"Authorization": f"Bearer {key}x"})
            http.post("/functions/v1/scheduler-tick", headers={"Authorization": "Bearer nope"})
            http.post("/functions/v1/scheduler-tick",
                      headers={"Authorization": f"Bearer {TICK_SECRET}"})
            http.delete(f"{JOBS}/jobs/{made.json()['id']}",
                        headers={"Authorization": f"Bearer {key}"})
    finally:
        child.terminate()
        try:
            out, _ = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate(timeout=10)
    return out
