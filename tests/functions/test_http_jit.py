"""No route makes PostgreSQL compile a plan with JIT.

PostgreSQL's default is jit = on: a plan whose estimated cost passes jit_above_cost is
compiled to machine code before it runs. Our functions run short queries over functions the
planner guesses a thousand rows for, so a plan can cost millions while it runs in 20 ms, and
compiling it takes seconds (GET /queue took about 2 s a request this way). The functions that
are prone to it set jit = off for themselves; this test holds every route to that on a server
with JIT available: each request's statements, nested ones included, are written to the
server log by auto_explain (loaded for the gateway's own connections only), and none may show
a JIT section.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from fn_support import Api, Db, FakeProvider
from werkzeug.test import Client

from sftq_server.core.settings import Settings
from sftq_server.dev.pgcluster import LocalCluster
from sftq_server.http.gateway import make_gateway

SPEC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
JOBS = "/functions/v1/jobs-api"
# Every statement of the gateway's sessions, with what it executed (JIT appears only then).
EXPLAIN_OPTIONS = " ".join(f"-c {k}={v}" for k, v in {
    "session_preload_libraries": "auto_explain",
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_nested_statements": "on",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_timing": "off",
}.items())
# The log's own lines start with a timestamp; a plan continues on the lines after its own.
ENTRY = re.compile(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
# A plan that was compiled says so in a section of its own.
JIT = re.compile(r"^\s*JIT:", re.M)


def _entries(log: Path, offset: int) -> list[str]:
    with log.open(encoding="utf-8", errors="replace") as f:
        f.seek(offset)
        return ENTRY.split(f.read())


def _jit_plans(entries: list[str]) -> list[str]:
    """The start of each statement that was compiled."""
    return [" ".join(e.split("Query Text:", 1)[-1].split())[:300] for e in entries if JIT.search(e)]


@pytest.fixture
def explained_url(db_url: str) -> str:
    with psycopg.connect(db_url) as conn:
        jit = conn.execute("SELECT pg_jit_available(), current_setting('jit')::bool").fetchone()
        pkglib = conn.execute("SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'").fetchone()
    if not (jit and jit[0] and jit[1]):
        pytest.skip("this PostgreSQL cannot JIT-compile (no LLVM, or jit = off): nothing to catch")
    if not (pkglib and (Path(pkglib[0]) / "auto_explain.so").exists()):
        pytest.skip("this PostgreSQL has no auto_explain module to show the plans")
    return f"{db_url}?options={quote(EXPLAIN_OPTIONS)}"


METRICS_TOKEN = "jit-test-metrics-token-0123456789"


@pytest.fixture
def world(explained_url: str, db_url: str) -> Iterator[dict[str, Any]]:
    """alice with jobs in every state, bob with some queued, served by the whole gateway."""
    settings = Settings(database_url=explained_url, db_timeout_seconds=5.0,
                        fireworks_api_key="", fireworks_account_id="",
                        webhooks_key="jit-test-webhooks-key-0123456789abcdefghij",
                        metrics_token=METRICS_TOKEN)
    gateway = make_gateway(settings, provider_factory=FakeProvider)
    api = Api(Client(gateway), prefix=JOBS)
    with psycopg.connect(db_url, autocommit=True) as conn:
        db = Db(conn)
        alice, bob = db.user("alice"), db.user("bob")
        done = api.enqueue(alice, "DPO")
        running = api.enqueue(alice, "RFT", gpu_count=4)
        for _ in range(30):
            api.enqueue(bob)
        db.admit(100)
        db.submitted(done, "DPO")
        db.submitted(running, "RFT")
        db.provider_state(done, "JOB_STATE_COMPLETED")
        for _ in range(30):
            api.enqueue(alice, gpu_count=2)
        try:
            yield {"api": api, "alice": alice, "job": done, "queued": api.enqueue(alice)}
        finally:
            gateway.close()


def test_the_detector_sees_a_plan_compiled_with_jit(explained_url: str,
                                                   pg_cluster: LocalCluster) -> None:
    offset = pg_cluster.log_path.stat().st_size
    with psycopg.connect(explained_url) as conn:
        conn.execute("SET jit_above_cost = 0")
        conn.execute("SELECT sum(x) FROM generate_series(1, 1000) x WHERE x % 7 = 3").fetchone()
    assert _jit_plans(_entries(pg_cluster.log_path, offset))


def test_no_route_compiles_a_plan_with_jit(world: dict[str, Any],
                                           pg_cluster: LocalCluster) -> None:
    api, key, job = world["api"], world["alice"], world["job"]
    spec = json.loads(SPEC.read_text())
    offset = pg_cluster.log_path.stat().st_size
    statuses: dict[str, int] = {}
    for path, item in spec["paths"].items():
        if "get" not in item or path.endswith("/stream"):
            continue  # the streams' queries: tests/stream's, on their own connection
        url = path.replace("{id}", job if path.startswith("/jobs") else str(uuid.uuid4()))
        url = url.replace("{name}", "app.js")
        # GET /metrics takes an operator's credential, not a user's key.
        bearer = METRICS_TOKEN if path == "/metrics" else key
        statuses[f"GET {path}"] = api.get(url, bearer).status_code
    statuses["POST /jobs"] = api.submit(key, "SFT").status_code
    statuses["DELETE /jobs/{id}"] = api.delete(f"/jobs/{world['queued']}", key).status_code
    statuses["POST /jobs/{id}/retry"] = api.post(f"/jobs/{world['queued']}/retry",
                                                 key).status_code
    assert [k for k, v in statuses.items() if v >= 500] == [], statuses
    # Answers, not refusals before the database (the webhooks' ids are nobody's: 404).
    assert {k for k, v in statuses.items() if v >= 400} == {
        "GET /webhooks/{id}", "GET /webhooks/{id}/deliveries"}, statuses

    entries = _entries(pg_cluster.log_path, offset)
    # The plans were written: an empty list below means no JIT, not no logging.
    assert sum("plan:" in e for e in entries) >= len(statuses)
    assert _jit_plans(entries) == []
