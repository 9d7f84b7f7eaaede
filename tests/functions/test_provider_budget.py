"""One provider budget for the whole deployment, and resource names that cannot hurt a URL
(issue 52, items 1 and 2).

Real HTTP through jobs-api's gateway against the simulator, and the tick as it runs: every
process's Fireworks calls draw on one FIREWORKS_RPM kept in PostgreSQL, with a reserve the
users' lookups never take; a 429 that any process meets holds them all; lookups are shared
between processes; the metrics count every call with its source."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from fn_support import Db
from prometheus_client.parser import text_string_to_metric_families

from sftq_server.budget import DbBudget
from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.http.gateway import make_server
from sftq_server.provider import FireworksClient, NotFound
from sftq_server.scheduler.tick import run_tick
from sftq_server.simulator import Simulator, SimulatorServer

ACCOUNT = "sim-account"
DATASET = f"accounts/{ACCOUNT}/datasets/chats"
MODEL = "accounts/fireworks/models/qwen3-8b"
SFT = {"dataset": DATASET, "baseModel": MODEL}
METRICS_TOKEN = "metrics-token-for-the-budget-tests-0123456789"


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    with SimulatorServer(Simulator(account_id=ACCOUNT, job_seconds=3600)) as running:
        yield running


def _settings(db_url: str, sim: SimulatorServer, **changes: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": db_url, "preflight": True, "fireworks_base_url": sim.url,
        "fireworks_api_key": "sim-key", "fireworks_account_id": ACCOUNT,
        "fireworks_timeout_seconds": 2.0, "preflight_budget_ms": 2000.0,
        "metrics_token": METRICS_TOKEN}
    values.update(changes)
    return Settings(**values)


@pytest.fixture
def serve(db_url: str, sim: SimulatorServer) -> Iterator[Any]:
    """Start a jobs-api gateway of its own (its own pool: another process, as far as the
    database can tell) and answer its base URL."""
    servers: list[Any] = []

    def start(**changes: Any) -> str:
        server = make_server("127.0.0.1", 0, _settings(db_url, sim, **changes))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}/functions/v1/jobs-api"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
        server.app.close()


@pytest.fixture
def key(db: Db) -> str:
    return db.user("alice")


def post(base: str, key: str, body: dict[str, Any], path: str = "/jobs") -> httpx.Response:
    return httpx.post(base + path, json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=10)


def tick(db_url: str, sim: SimulatorServer, **changes: Any) -> dict[str, Any]:
    """One tick as scheduler-tick runs it: its client draws on the deployment's budget."""
    settings = _settings(db_url, sim, **changes)
    db = Database(db_url, max_size=2)
    client = FireworksClient(base_url=sim.url, api_key="sim-key", account_id=ACCOUNT,
                             timeout=2.0, rpm=settings.fireworks_rpm,
                             budget=DbBudget(db, settings, "tick"))
    try:
        return run_tick(db, client, settings)
    finally:
        client.close()
        db.close()


def sql(db_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


# -- resource names (item 1) ------------------------------------------------------------------

HOSTILE = [
    f"accounts/{ACCOUNT}/datasets/foo\n",        # `$` used to accept the trailing newline
    f"accounts/{ACCOUNT}/datasets/a%2Fb",
    f"accounts/{ACCOUNT}/datasets/a?x=1",
    f"accounts/{ACCOUNT}/datasets/a#frag",
    f"accounts/{ACCOUNT}/datasets/../quotas/x",
    f"accounts/{ACCOUNT}/datasets/a..b",
    f"accounts/{ACCOUNT}/datasets/d\u00e9j\u00e0",
    f"accounts/{ACCOUNT}/datasets/a\tb",
    f"accounts/{ACCOUNT}/datasets/" + "x" * 300,
    "accounts/UPPER/datasets/d",
    f"accounts/{ACCOUNT}/models/not-a-dataset",
    "a/b",
    "",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_that_is_no_resource_name_is_a_400_at_enqueue_and_reaches_nobody(
        serve: Any, key: str, db_url: str, sim: SimulatorServer, name: str) -> None:
    base = serve()
    sim.simulator.clear_requests()
    for path in ("/jobs", "/jobs:validate"):
        answer = post(base, key, {"kind": "SFT", "fireworks_payload": SFT | {"dataset": name}},
                      path)
        if path == "/jobs":
            assert answer.status_code == 400, answer.text
            body = answer.json()
            assert body["code"] == "invalid_fireworks_payload"
            details = body["details"]
        else:
            assert answer.status_code == 200, answer.text
            assert answer.json()["valid"] is False
            assert answer.json()["provider_checks"] == "skipped"
            details = answer.json()["errors"]
        assert [d["path"] for d in details] == ["fireworks_payload.dataset"], details
        assert "accounts/<account>/datasets/<id>" in details[0]["message"]
    assert sql(db_url, "SELECT count(*) FROM sftq.jobs") == [(0,)]
    assert sim.simulator.requests() == []


def test_every_path_segment_is_percent_encoded() -> None:
    """Whatever an id or the account holds, it addresses one segment: nothing of it is read
    as a path separator, a query or a fragment."""
    seen: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path)
        return httpx.Response(404, json={"code": 5, "message": "not found"})

    client = FireworksClient(base_url="http://fw.test", api_key="k", account_id="a/b?c#d",
                             quota_id="q/../x?y#z", transport=httpx.MockTransport(answer))
    with client:
        with pytest.raises(NotFound):
            client.get_quota()
        assert seen == [b"/v1/accounts/a%2Fb%3Fc%23d/quotas/q%2F..%2Fx%3Fy%23z"]
        with pytest.raises(ValueError):
            client.get_resource("accounts/a/datasets/x\n")
        with pytest.raises(ValueError):
            client.get_job("SFT", "sftq-1\n")
        assert client.resource_name("datasets", "foo\n") is None
        assert seen == [b"/v1/accounts/a%2Fb%3Fc%23d/quotas/q%2F..%2Fx%3Fy%23z"]


def test_another_accounts_resources_are_a_warning_and_never_looked_up(
        serve: Any, key: str, sim: SimulatorServer) -> None:
    base = serve()
    sim.simulator.clear_requests()
    payload = {"dataset": "accounts/other-acct/datasets/d1",
               "evaluator": "accounts/y/evaluators/ev",
               "inferenceParameters": {"responseCandidatesCount": 4}}
    answer = post(base, key, {"kind": "RFT", "fireworks_payload": payload})
    assert answer.status_code == 201, answer.text
    warned = {w["path"]: w["message"] for w in answer.json()["warnings"]}
    assert set(warned) == {"fireworks_payload.dataset", "fireworks_payload.evaluator"}
    assert all("another Fireworks account" in m for m in warned.values()), warned
    body = post(base, key, {"kind": "RFT", "fireworks_payload": payload}, "/jobs:validate").json()
    assert {w["path"] for w in body["warnings"]} == set(warned)
    paths = [r["path"] for r in sim.simulator.requests()]
    assert not [p for p in paths if "other-acct" in p or "accounts/y/" in p], paths
    # The public models' account and our own are still looked up.
    post(base, key, {"kind": "SFT", "fireworks_payload": SFT}, "/jobs:validate")
    paths = [r["path"] for r in sim.simulator.requests()]
    assert f"/v1/{MODEL}" in paths and f"/v1/{DATASET}" in paths, paths


# -- the budget (item 2) ------------------------------------------------------------------------


def test_the_window_never_holds_more_than_rpm_whatever_the_mix(db_url: str) -> None:
    """The procedure itself, on a made-up clock: 3,000 takes by the tick and four users at
    random moments over ten minutes; in no 60 s window are more than FIREWORKS_RPM granted,
    the users' lookups never more than the share outside the reserve, one user never more
    than their share of it, and the tick always gets its reserve."""
    rng = random.Random(52)
    rpm, reserve, share = 40, 0.5, 0.25
    users = [bytes([i]) * 32 for i in range(4)]
    granted: list[tuple[float, str, bytes]] = []
    t = 0.0
    with psycopg.connect(db_url, autocommit=True) as conn:
        for _ in range(3000):
            t += rng.expovariate(5.0)
            source = rng.choice(["tick", "validate", "preflight", "mcp", "validate"])
            user = b"" if source == "tick" else rng.choice(users)
            (answer,) = conn.execute(
                "SELECT sftq.provider_budget_take(%s, 'get_dataset', %s, %s, %s, %s, NULL, NULL,"
                " 60, timestamptz '2026-01-01 00:00:00+00' + make_interval(secs => %s))",
                (source, user, rpm, reserve, share, t)).fetchone()
            if answer["ok"]:
                granted.append((t, source, user))
            else:
                assert answer.get("wait", 0) > 0 or answer.get("hold", 0) > 0, answer
    assert len(granted) > 200

    def most(pick: Any) -> int:
        times = sorted(at for at, source, user in granted if pick(source, user))
        best, j = 0, 0
        for i, at in enumerate(times):
            while times[j] <= at - 60:
                j += 1
            best = max(best, i - j + 1)
        return best

    assert most(lambda s, u: True) <= rpm
    assert most(lambda s, u: s != "tick") <= rpm * (1 - reserve)
    for user in users:
        assert most(lambda s, u, user=user: u == user) <= int(rpm * (1 - reserve) * share)
    # The users wanted far more than their share, yet the tick still got what it asked for.
    assert most(lambda s, u: s == "tick") >= rpm * reserve * 0.9


def test_a_validate_loop_leaves_the_tick_its_reserve(serve: Any, db: Db, db_url: str,
                                                     sim: SimulatorServer) -> None:
    """Issue 52's loop: at FIREWORKS_RPM=60, fifteen sequential validates used to spend the
    whole minute and the next tick met a 429. Now the users' lookups stop at their share
    (each validate past it is answered at once, with a warning), and the tick that follows
    makes every call it needs and meets no 429."""
    sim.simulator.set_rate_limit({"rpm": 60})
    base = serve(fireworks_rpm=60, provider_user_share=1.0)
    alice, bob = db.user("alice"), db.user("bob")
    job = post(base, bob, {"kind": "SFT", "fireworks_payload": SFT, "validate": "off"})
    assert job.status_code == 201, job.text
    skipped = 0
    for i in range(50):
        # A new dataset each time: nothing is answered from the shared lookups.
        payload = SFT | {"dataset": f"accounts/{ACCOUNT}/datasets/d{i}"}
        answer = post(base, alice, {"kind": "SFT", "fireworks_payload": payload},
                      "/jobs:validate")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        if body["provider_checks"] == "unanswered":
            skipped += 1
            assert any(w["message"].startswith("pre-flight lookups skipped: the provider budget")
                       for w in body["warnings"]), body
        # Never waits for a slot (one would free only when the window's oldest second
        # leaves it, tens of seconds away); the bound leaves room for a busy machine.
        assert answer.elapsed.total_seconds() < 3.0
    assert skipped >= 30
    # POST /jobs past the share: accepted at once, with the warning, checked by the tick.
    late = post(base, alice, {"kind": "SFT", "fireworks_payload": SFT | {
        "dataset": f"accounts/{ACCOUNT}/datasets/late"}})
    assert late.status_code == 201, late.text
    assert any("pre-flight lookups skipped" in w["message"] for w in late.json()["warnings"])
    lookups = len(sim.simulator.requests())
    assert lookups <= 30  # FIREWORKS_RPM x (1 - SFTQ_PROVIDER_TICK_RESERVE)

    result = tick(db_url, sim, fireworks_rpm=60, provider_user_share=1.0)
    assert result["status"] == "ok", result
    assert not [e for e in result["errors"] if "429" in e or "budget" in e], result
    assert result["provider_backoff_until"] is None
    faults = [r for r in sim.simulator.requests() if r["fault"]]
    assert faults == [] and sim.simulator.rate_limit()["refused"] == 0
    assert sql(db_url, "SELECT state FROM sftq.jobs WHERE id = %s",
               job.json()["id"]) == [("PROGRESS",)]
    # The whole test ran within a minute: the simulator's count is any window's count.
    assert len(sim.simulator.requests()) <= 60


def test_each_user_gets_only_a_share_of_the_lookups(serve: Any, db: Db, db_url: str,
                                                    sim: SimulatorServer) -> None:
    base = serve(fireworks_rpm=60)  # lookups: 30 a minute; each user 25% of them: 7
    alice, bob = db.user("alice"), db.user("bob")

    def validates(key: str, n: int, tag: str) -> int:
        asked = 0
        for i in range(n):
            payload = SFT | {"dataset": f"accounts/{ACCOUNT}/datasets/{tag}{i}"}
            body = post(base, key, {"kind": "SFT", "fireworks_payload": payload},
                        "/jobs:validate").json()
            asked += body["provider_checks"] == "done"
        return asked

    sim.simulator.clear_requests()
    assert validates(alice, 10, "a") <= 4
    alice_calls = len(sim.simulator.requests())
    assert alice_calls <= 7
    # A second key of hers is the same user, with the same share (already spent).
    (second_key,) = sql(db_url, "SELECT key FROM sftq.issue_key('alice')")[0]
    assert validates(second_key, 2, "c") == 0
    assert len(sim.simulator.requests()) == alice_calls
    # Alice's loop spent her share only: Bob's lookups still go.
    assert validates(bob, 2, "b") == 2


def test_a_429_seen_by_jobs_api_holds_the_tick(serve: Any, key: str, db_url: str,
                                               sim: SimulatorServer) -> None:
    base = serve()
    sim.simulator.set_faults(rules=[{"method": "GET", "path": "/datasets/", "status": 429,
                                     "body": {"code": 8, "message": "slow down"},
                                     "headers": {"Retry-After": "30"}, "times": 1}])
    answer = post(base, key, {"kind": "SFT", "fireworks_payload": SFT})
    assert answer.status_code == 201, answer.text
    sim.simulator.clear_requests()
    result = tick(db_url, sim)
    assert sim.simulator.requests() == []  # the tick sent nothing inside the hold
    assert result["provider_backoff_until"] is not None
    # ... and another jobs-api process holds too.
    other = serve()
    body = post(other, key, {"kind": "SFT", "fireworks_payload": SFT}, "/jobs:validate").json()
    assert body["provider_checks"] == "unanswered"
    assert sim.simulator.requests() == []


def test_a_429_seen_by_the_tick_holds_jobs_api(serve: Any, key: str, db_url: str,
                                               sim: SimulatorServer) -> None:
    base = serve()
    post(base, key, {"kind": "SFT", "fireworks_payload": SFT, "validate": "off"})
    sim.simulator.set_faults(rules=[{"method": "GET", "path": "/quotas/", "status": 429,
                                     "body": {"code": 8, "message": "slow down"},
                                     "headers": {"Retry-After": "30"}}])
    result = tick(db_url, sim)
    assert any("429" in e for e in result["errors"]), result
    sim.simulator.set_faults()
    sim.simulator.clear_requests()
    body = post(base, key, {"kind": "SFT", "fireworks_payload": SFT}, "/jobs:validate").json()
    assert body["provider_checks"] == "unanswered"
    answer = post(base, key, {"kind": "SFT", "fireworks_payload": SFT})
    assert answer.status_code == 201, answer.text
    assert sim.simulator.requests() == []
    (until,) = sql(db_url, "SELECT sftq.provider_backoff_until()")[0]
    assert until is not None


def test_lookups_are_shared_between_processes(serve: Any, key: str,
                                              sim: SimulatorServer) -> None:
    first, second = serve(), serve()
    sim.simulator.clear_requests()
    post(first, key, {"kind": "SFT", "fireworks_payload": SFT}, "/jobs:validate")
    gets = [r["path"] for r in sim.simulator.requests() if r["method"] == "GET"]
    assert sorted(gets) == sorted([f"/v1/{DATASET}", f"/v1/{MODEL}"]), gets
    sim.simulator.clear_requests()
    body = post(second, key, {"kind": "SFT", "fireworks_payload": SFT}, "/jobs:validate").json()
    assert body["valid"] is True and body["provider_checks"] == "done"
    # Only the cost estimate is asked again; what the resources are, the first one learned.
    assert [r["method"] for r in sim.simulator.requests()] == ["POST"]
    # A missing resource is never taken from another process: it may exist the next moment.
    sim.simulator.set_resources({"resources": {f"accounts/{ACCOUNT}/datasets/new": None}})
    payload = SFT | {"dataset": f"accounts/{ACCOUNT}/datasets/new"}
    assert post(first, key, {"kind": "SFT", "fireworks_payload": payload}).status_code == 400
    sim.simulator.set_resources({"reset": True})
    assert post(second, key, {"kind": "SFT", "fireworks_payload": payload}).status_code == 201


def _provider_requests(base: str) -> dict[tuple[str, str, str], float]:
    text = httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
                     timeout=10).text
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "sftq_provider_requests":
            for s in family.samples:
                if s.name == "sftq_provider_requests_total":
                    out[(s.labels["source"], s.labels["call"], s.labels["status"])] = s.value
    return out


def test_metrics_count_every_call_with_its_source(serve: Any, key: str, db_url: str,
                                                  sim: SimulatorServer) -> None:
    base = serve()
    post(base, key, {"kind": "SFT", "fireworks_payload": SFT}, "/jobs:validate")
    other = SFT | {"dataset": f"accounts/{ACCOUNT}/datasets/other"}
    assert post(base, key, {"kind": "SFT", "fireworks_payload": other}).status_code == 201
    tick(db_url, sim)
    counts = _provider_requests(base)
    assert counts[("validate", "get_dataset", "200")] == 1
    assert counts[("validate", "get_model", "200")] == 1
    assert counts[("validate", "estimate_cost", "200")] == 1
    assert counts[("preflight", "get_dataset", "200")] == 1  # the model: shared lookup
    assert counts[("preflight", "estimate_cost", "200")] == 1
    assert counts[("tick", "get_quota", "200")] >= 1
    assert sum(counts.values()) == len(sim.simulator.requests())


def test_mcp_lookups_count_as_source_mcp(serve: Any, key: str, sim: SimulatorServer) -> None:
    """The MCP endpoint reaches pre-flight through jobs-api in-process: its lookups draw on
    the same budget (the caller's share) and are counted as source mcp."""
    pytest.importorskip("mcp")
    base = serve()
    mcp_url = base.removesuffix("/jobs-api") + "/mcp"
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "submit_job",
                       "arguments": {"kind": "SFT", "fireworks_payload": SFT}}}
    answer = httpx.post(mcp_url, json=call, timeout=30, headers={
        "Accept": "application/json, text/event-stream", "Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    assert '"isError":true' not in answer.text, answer.text
    counts = _provider_requests(base)
    assert counts[("mcp", "get_dataset", "200")] == 1
    assert counts[("mcp", "get_model", "200")] == 1
    assert not [k for k in counts if k[0] == "preflight"], counts
    assert sum(counts.values()) == len(sim.simulator.requests())


class _BrokenBudget:
    source = "tick"
    max_wait = 2.0

    def take(self, call: str) -> Any:
        raise RuntimeError("database gone")

    def done(self, call: str, status: str) -> None:
        pass

    def hold(self, seconds: float) -> None:
        pass


def test_a_budget_that_cannot_answer_never_stops_the_scheduler(db_url: str) -> None:
    """The tick's client falls back to pacing itself; a user's lookup is simply not sent."""
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return httpx.Response(200, json={"name": "q", "value": "8", "maxValue": "8"})

    client = FireworksClient(base_url="http://fw.test", api_key="k", account_id="acct",
                             transport=httpx.MockTransport(answer), budget=_BrokenBudget())
    with client:
        assert client.get_quota().limit == 8
    assert sent == ["/v1/accounts/acct/quotas/training-h200-count"]

    settings = Settings(database_url="postgresql://nobody@127.0.0.1:1/none", fireworks_rpm=60)
    db = Database(settings.database_url, max_size=1, timeout=0.5)
    try:
        budget = DbBudget(db, settings, "tick")
        with budget.acting_for("validate", b"u" * 32):
            grant = budget.take("get_dataset")
        assert not grant.ok and "could not be read" in grant.why
        with pytest.raises(Exception):  # noqa: B017 - the client paces the tick itself
            budget.take("get_quota")
    finally:
        db.close()


@pytest.mark.parametrize("role", ["sftq_api", "sftq_scheduler"])
def test_both_roles_draw_on_the_budget(db_url: str, role: str) -> None:
    """jobs-api's role and the scheduler's may call every budget procedure (and nothing
    else of it: the tables stay closed to them)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"SET ROLE {role}")
        (answer,) = conn.execute(
            "SELECT sftq.provider_budget_take('validate', 'get_dataset', %s, 60, 0.5, 0.25,"
            " '[{\"source\": \"validate\", \"call\": \"get_model\", \"status\": \"200\","
            " \"count\": 1}]', '{\"accounts/a/datasets/d\": [\"ok\", \"READY\"]}')",
            (b"u" * 32,)).fetchone()
        assert answer == {"ok": True}
        (found,) = conn.execute(
            "SELECT sftq.provider_lookups_get(ARRAY['accounts/a/datasets/d'], 60)").fetchone()
        assert found == {"accounts/a/datasets/d": ["ok", "READY"]}
        conn.execute("SELECT sftq.provider_budget_flush(NULL, NULL)")
        (until,) = conn.execute("SELECT sftq.provider_budget_hold(30)").fetchone()
        assert until is not None
        if role == "sftq_scheduler":
            assert conn.execute("SELECT sftq.provider_backoff_until()").fetchone()[0] == until
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM sftq.provider_budget_use")


def test_a_cancels_stop_is_counted_as_source_cancel(serve: Any, key: str, db_url: str,
                                                    sim: SimulatorServer) -> None:
    base = serve()
    job = post(base, key, {"kind": "SFT", "fireworks_payload": SFT, "validate": "off"}).json()
    tick(db_url, sim)
    assert sql(db_url, "SELECT state FROM sftq.jobs WHERE id = %s", job["id"]) == [("PROGRESS",)]
    answer = httpx.delete(f"{base}/jobs/{job['id']}", headers={"Authorization": f"Bearer {key}"},
                          timeout=10)
    assert answer.status_code in (200, 202), answer.text
    counts = _provider_requests(base)
    assert counts[("cancel", "delete_job", "200")] == 1, counts
    assert sum(counts.values()) == len(sim.simulator.requests())


# -- the tick's own share (the noisy-neighbour test's findings) --------------------------------


def test_the_ticks_pre_flight_spends_the_owners_share_not_the_ticks_reserve(
        serve: Any, key: str, db_url: str, sim: SimulatorServer) -> None:
    """A job whose lookups were not made at enqueue is checked by the tick on its owner's share
    of the lookups: a user who spent theirs (or whose many jobs wait unchecked) cannot make the
    tick spend its reserve on them."""
    base = serve(preflight_budget_ms=0.0)  # every check is left to the tick
    answer = post(base, key, {"kind": "SFT", "fireworks_payload": SFT})
    assert answer.status_code == 201, answer.text
    result = tick(db_url, sim)
    assert result["status"] == "ok" and result["preflight_checked"] == 1, result
    by_class = dict(sql(db_url, "SELECT class, sum(n)::int FROM sftq.provider_budget_use "
                                "GROUP BY class"))
    # The dataset and the model (and SFT's cost) went on alice's share; the tick's class holds
    # only its own calls (the quota, the create, the second quota reading).
    (owner,) = sql(db_url, "SELECT int8send(user_id) FROM sftq.jobs")[0]
    mine = sql(db_url, "SELECT sum(n)::int FROM sftq.provider_budget_use "
                       "WHERE class = 'lookup' AND user_key = %s", owner)[0][0]
    assert mine == by_class["lookup"] >= 2, by_class
    assert by_class["tick"] <= 3, by_class


def test_a_budget_the_tick_cannot_spend_defers_its_calls_without_an_error(
        serve: Any, key: str, db_url: str, sim: SimulatorServer) -> None:
    """At a low FIREWORKS_RPM the budget may have no slot left for the tick: the calls it
    could not make are not sent, noted (budget_deferred), never an error, a 429 or a hold;
    an admitted job's create waits for the next tick without losing an attempt."""
    base = serve()
    post(base, key, {"kind": "SFT", "fireworks_payload": SFT, "validate": "off"})
    # The window full of the tick's own calls, as if earlier ticks had spent them all.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sftq.provider_budget_use (second, class, n) "
                     "VALUES (floor(extract(epoch FROM now()))::bigint, 'tick', 60)")
    result = tick(db_url, sim, fireworks_rpm=60)
    assert result["status"] == "ok", result
    assert result["budget_deferred"] >= 1 and result["notes"], result
    assert result["provider_backoff_until"] is None and not result["errors"], result
    assert sim.simulator.requests() == []
    (until,) = sql(db_url, "SELECT sftq.provider_backoff_until()")[0]
    assert until is None
