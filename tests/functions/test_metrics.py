"""GET /metrics (issue 45): scraped over HTTP with prometheus_client's own parser, and every
series checked against counts taken in SQL after jobs went through several states, ticks ran
against the simulator, webhooks were attempted and a stream server registered its streams."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fn_support import Api, Db, assert_error
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.test import Client

from sftq_server.core.settings import Settings
from sftq_server.core.tick_secret import tick_token
from sftq_server.db import Database
from sftq_server.http.apps import make_jobs_api
from sftq_server.http.web import wsgi_app
from sftq_server.provider import FireworksClient
from sftq_server.scheduler.tick import run_tick
from sftq_server.simulator import Simulator, SimulatorServer

PATH = "/functions/v1/jobs-api/metrics"
TICK_SECRET = "metrics-test-tick-secret-0123456789abcdef"
METRICS_TOKEN = "metrics-token-fedcba9876543210"
ACCOUNT = "sim-account"
FW_KEY = "fw-METRICS-test-key-0123456789"
PAYLOADS: dict[str, dict[str, Any]] = {
    "SFT": {"dataset": "accounts/a/datasets/d", "baseModel": "m"},
    "DPO": {"dataset": "accounts/a/datasets/d", "trainingConfig": {"baseModel": "m"}},
    "RFT": {"dataset": "accounts/a/datasets/d", "evaluator": "accounts/a/evaluators/e",
            "inferenceParameters": {"responseCandidatesCount": 4}},
}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def sim_server() -> Iterator[SimulatorServer]:
    with SimulatorServer(Simulator(account_id=ACCOUNT, job_seconds=0, max_value=64,
                                   seed=3)) as server:
        yield server


@pytest.fixture
def msettings(db_url: str, sim_server: SimulatorServer) -> Settings:
    return Settings(database_url=db_url, db_timeout_seconds=2.0, tick_secret=TICK_SECRET,
                    metrics_token=METRICS_TOKEN, fireworks_base_url=sim_server.url,
                    fireworks_api_key=FW_KEY, fireworks_account_id=ACCOUNT,
                    fireworks_timeout_seconds=5.0, submit_backoff_seconds=0.0)


@pytest.fixture
def mdb(db_url: str) -> Iterator[Database]:
    db = Database(db_url, max_size=4, timeout=5.0)
    yield db
    db.close()


@pytest.fixture
def mapi(msettings: Settings, mdb: Database) -> Iterator[Api]:
    app = make_jobs_api(msettings, db=mdb)
    try:
        yield Api(Client(wsgi_app(app)))
    finally:
        app.close()


@pytest.fixture
def fireworks(sim_server: SimulatorServer) -> Iterator[FireworksClient]:
    client = FireworksClient(base_url=sim_server.url, api_key=FW_KEY, account_id=ACCOUNT,
                             timeout=5.0)
    yield client
    client.close()


def scrape(api: Api, bearer: str = TICK_SECRET) -> tuple[Samples, set[str]]:
    resp = api.get(PATH, headers={"Authorization": f"Bearer {bearer}"})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.headers["Content-Type"] == CONTENT_TYPE_LATEST
    samples: Samples = {}
    families = set()
    for family in text_string_to_metric_families(resp.get_data(as_text=True)):
        families.add(family.name)
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, families


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def enqueue(api: Api, key: str, kind: str) -> str:
    body = {"kind": kind, "fireworks_payload": PAYLOADS[kind]}
    resp = api.post("/jobs", key, data=json.dumps(body), content_type="application/json")
    assert resp.status_code == 201, resp.get_data(as_text=True)
    return str(resp.json["id"])  # type: ignore[index]


def test_every_series_matches_the_database(mapi: Api, db: Db, msettings: Settings,
                                           mdb: Database, fireworks: FireworksClient,
                                           sim_server: SimulatorServer) -> None:
    alice, bob = db.user("alice"), db.user("bob")
    carol = db.user("carol")
    db.conn.execute("SELECT sftq.set_cap('carol', 0)")  # carol's jobs stay QUEUED
    a1, _a2, a3 = (enqueue(mapi, alice, "SFT") for _ in range(3))
    b1 = enqueue(mapi, bob, "DPO")
    enqueue(mapi, bob, "DPO")
    enqueue(mapi, carol, "RFT")
    enqueue(mapi, carol, "SFT")
    assert mapi.delete(f"/jobs/{a3}", alice).status_code == 200  # QUEUED -> CANCELLED

    tick = run_tick(mdb, fireworks, msettings, holder="test")
    assert tick["status"] == "ok", tick
    assert db.state(a1) == "PROGRESS" and db.state(b1) == "PROGRESS"
    sim = sim_server.simulator
    sim.finish("SFT", "sftq-" + a1.replace("-", ""), "JOB_STATE_COMPLETED")
    sim.finish("DPO", "sftq-" + b1.replace("-", ""), "JOB_STATE_FAILED", "out of memory")
    run_tick(mdb, fireworks, msettings, holder="test")
    assert db.state(a1) == "SUCCESS" and db.state(b1) == "FAIL"
    run_tick(mdb, fireworks, msettings, holder="test")  # admits the next two

    # Webhook attempts (the deliverer's record) and two stream servers, one gone quiet.
    db.conn.execute(
        "INSERT INTO sftq.webhook_attempts"
        "       (delivery_id, endpoint_id, attempt, attempted_at, outcome)"
        " SELECT 1, gen_random_uuid(), g, now(), o FROM unnest(ARRAY['succeeded', 'succeeded',"
        "        'retrying', 'failed']) WITH ORDINALITY t (o, g)")
    db.conn.execute("SELECT count(*) FROM sftq.stream_poll('instance-aaaaaaaaaaaa', '0'::xid8,"
                    " 0, 10, '{}'::bytea[], 120, 3)")
    db.conn.execute("INSERT INTO sftq.stream_instances VALUES ('instance-gone-bbbbbbb', 5,"
                    " now() - interval '1 second')")

    samples, families = scrape(mapi)
    assert families == {
        "sftq_pending_jobs", "sftq_running_jobs", "sftq_admission_wait_time_seconds",
        "sftq_admitted_jobs", "sftq_finished_jobs", "sftq_gpu_quota", "sftq_gpu_in_use",
        "sftq_tick_duration_seconds", "sftq_tick_last_success_timestamp_seconds",
        "sftq_provider_requests", "sftq_webhook_deliveries", "sftq_stream_connections",
        "sftq_stalled_jobs"}

    def sql(query: str) -> list[tuple[Any, ...]]:
        return db.conn.execute(query).fetchall()

    by_kind = {k: {"QUEUED": 0.0, "PROGRESS": 0.0} for k in ("SFT", "DPO", "RFT")}
    for kind, state, n in sql("SELECT kind, state, count(*) FROM sftq.jobs"
                              " WHERE state IN ('QUEUED', 'PROGRESS') GROUP BY 1, 2"):
        by_kind[kind][state] = float(n)
    assert series(samples, "sftq_pending_jobs") == {
        (("kind", k),): v["QUEUED"] for k, v in by_kind.items()}
    assert series(samples, "sftq_running_jobs") == {
        (("kind", k),): v["PROGRESS"] for k, v in by_kind.items()}
    assert sum(v["QUEUED"] for v in by_kind.values()) == 2  # carol's two (cap 0)
    admitted, wait_sum = sql("SELECT count(*), sum(extract(epoch FROM started_at - created_at))"
                             " FROM sftq.jobs WHERE started_at IS NOT NULL")[0]
    assert admitted == 4
    assert samples[("sftq_admitted_jobs_total", ())] == admitted
    assert samples[("sftq_admission_wait_time_seconds_count", ())] == admitted
    assert math.isclose(samples[("sftq_admission_wait_time_seconds_sum", ())], float(wait_sum),
                        rel_tol=1e-9, abs_tol=1e-6)
    assert samples[("sftq_admission_wait_time_seconds_bucket", (("le", "+Inf"),))] == admitted
    assert series(samples, "sftq_finished_jobs_total") == {
        (("failure_class", fc or ""), ("state", st)): float(n)
        for st, fc, n in sql("SELECT state, failure_class, count(*) FROM sftq.jobs"
                             " WHERE completed_at IS NOT NULL GROUP BY 1, 2")}
    assert {st for ((_, st),) in [k[1:] for k in series(samples, "sftq_finished_jobs_total")]} == {
        "SUCCESS", "FAIL", "CANCELLED"}

    quota = sim.quota()
    resource = quota.get("resource", quota)
    assert series(samples, "sftq_gpu_quota") == {
        (("kind", "enforced"),): float(resource.get("value", 64)),
        (("kind", "max"),): float(resource.get("maxValue", 64))}
    (queue_gpus,) = sql("SELECT COALESCE(sum(gpu_count), 0) FROM sftq.jobs"
                        " WHERE state = 'PROGRESS'")[0]
    in_use = series(samples, "sftq_gpu_in_use")
    assert in_use[(("owner", "queue"),)] == float(queue_gpus) > 0
    assert in_use[(("owner", "external"),)] == 0.0  # nobody else on the simulated account

    ticks, tick_seconds, last_ok = sql(
        "SELECT count(*), sum(extract(epoch FROM finished_at - started_at)),"
        "       extract(epoch FROM max(finished_at) FILTER (WHERE status = 'ok'))"
        "  FROM sftq.scheduler_ticks WHERE status IN ('ok', 'error')")[0]
    assert ticks == 3
    assert samples[("sftq_tick_duration_seconds_count", ())] == ticks
    assert math.isclose(samples[("sftq_tick_duration_seconds_sum", ())], float(tick_seconds),
                        rel_tol=1e-9, abs_tol=1e-6)
    last_success = samples[("sftq_tick_last_success_timestamp_seconds", ())]
    assert last_success == pytest.approx(float(last_ok))
    assert abs(last_success - time.time()) < 60

    recorded: dict[tuple[tuple[str, str], ...], float] = {}
    for call, status, n in sql(
            "SELECT r ->> 'call', r ->> 'status', sum((r ->> 'count')::int)"
            "  FROM sftq.scheduler_ticks t, jsonb_array_elements(t.detail -> 'provider_requests') r"
            " GROUP BY 1, 2"):
        recorded[(("call", call), ("source", "tick"), ("status", status))] = float(n)
    assert series(samples, "sftq_provider_requests_total") == recorded
    assert sum(recorded.values()) == len(sim.requests()) == fireworks.calls_made
    calls = {c for ((_, c), _source, _s) in recorded}
    assert calls >= {"get_quota", "create_job"} and calls & {"get_job", "list_jobs"}, calls

    assert series(samples, "sftq_webhook_deliveries_total") == {
        (("result", o),): float(n) for o, n in sql(
            "SELECT o, count(a.id) FROM unnest(ARRAY['succeeded', 'retrying', 'failed']) o"
            "  LEFT JOIN sftq.webhook_attempts a ON a.outcome = o GROUP BY o")}
    (live_streams,) = sql("SELECT sum(open_streams) FROM sftq.stream_instances"
                          " WHERE expires_at > now()")[0]
    assert samples[("sftq_stream_connections", ())] == float(live_streams) == 3.0


def test_figures_stay_right_across_folds(mapi: Api, db: Db) -> None:
    """Counts appended between ticks and folded ones read the same."""
    alice = db.user("alice")
    for _ in range(3):
        enqueue(mapi, alice, "SFT")
    before, _ = scrape(mapi)
    rows = db.one("SELECT count(*) FROM sftq.metric_counts")
    db.one("SELECT sftq.metrics_fold()")
    assert db.one("SELECT count(*) FROM sftq.metric_counts") <= rows
    after, _ = scrape(mapi)
    assert after == before
    assert after[("sftq_pending_jobs", (("kind", "SFT"),))] == 3.0


def test_never_public(mapi: Api) -> None:
    assert_error(mapi.get(PATH), 401, "unauthorized")
    resp = mapi.get(PATH, headers={"Authorization": "Bearer not-the-secret"})
    assert_error(resp, 401, "unauthorized")
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert_error(mapi.get(PATH, headers={"Authorization": f"Basic {METRICS_TOKEN}"}), 401,
                 "unauthorized")
    # An API key is not enough either.
    assert_error(mapi.get(PATH, headers={"Authorization": "Bearer sftq_" + "0" * 48}), 401,
                 "unauthorized")


@pytest.mark.parametrize("bearer", ["secret", "minted", "metrics_token"])
def test_tick_secret_its_tokens_and_the_metrics_token_may_scrape(mapi: Api, bearer: str) -> None:
    token = {"secret": TICK_SECRET, "minted": tick_token(TICK_SECRET),
             "metrics_token": METRICS_TOKEN}[bearer]
    samples, _ = scrape(mapi, token)
    assert samples[("sftq_admitted_jobs_total", ())] == 0.0


def test_without_any_credential_configured_it_says_what_to_set(db_url: str, mdb: Database) -> None:
    app = make_jobs_api(Settings(database_url=db_url), db=mdb)
    try:
        api = Api(Client(wsgi_app(app)))
        body = assert_error(api.get(PATH, headers={"Authorization": "Bearer x"}), 401,
                            "unauthorized")
        assert "SFTQ_METRICS_TOKEN" in body["error"]
    finally:
        app.close()


def test_refused_credentials_show_as_provider_401s(mapi: Api, db: Db, msettings: Settings,
                                                   mdb: Database, fireworks: FireworksClient,
                                                   sim_server: SimulatorServer) -> None:
    """What the provider-auth alert (docs/operations.md) reads: the quota read answered 401."""
    enqueue(mapi, db.user("alice"), "SFT")
    sim_server.simulator.set_faults(rules=[{
        "method": "GET", "path": r"/quotas/", "status": 401,
        "body": {"code": 16, "message": "invalid API key", "details": []}}])
    tick = run_tick(mdb, fireworks, msettings, holder="test")
    assert tick["provider_auth_failed"] is True
    samples, _ = scrape(mapi, METRICS_TOKEN)
    requests = series(samples, "sftq_provider_requests_total")
    assert requests[(("call", "get_quota"), ("source", "tick"), ("status", "401"))] >= 1
    assert samples[("sftq_tick_last_success_timestamp_seconds", ())] == 0.0  # never a clean tick
    assert samples[("sftq_admitted_jobs_total", ())] == 0.0
