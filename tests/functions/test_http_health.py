"""Health, the database going away and coming back, unexpected errors, and the access log."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from fn_support import SFT_PAYLOAD, Api, Db, FakeProvider, assert_error
from werkzeug.test import Client

from sftq_server.core.errors import SftqError
from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.dev.pgcluster import LocalCluster
from sftq_server.http.apps import make_jobs_api
from sftq_server.http.web import wsgi_app
from sftq_server.provider import Transient


def test_health_answers_ok(api: Api) -> None:
    resp = api.get("/health")
    assert resp.status_code == 200
    # "provider" (issue 10): no tick has asked the provider yet.
    assert resp.json == {"status": "ok", "database": "ok", "last_tick": None, "provider": None}
    assert resp.headers["Cache-Control"] == "no-store"


def test_health_shows_the_last_tick(api: Api, db: Db) -> None:
    db.conn.execute("SELECT sftq.tick_begin('t1')")
    last_tick = api.get("/health").json["last_tick"]  # type: ignore[index]
    assert isinstance(last_tick, str) and last_tick.endswith("Z")


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = fn()
    return result, time.monotonic() - started


def test_database_down_is_a_prompt_503_and_recovers_by_itself(
        pg_cluster: LocalCluster, db_url: str, settings: Settings, alice: str) -> None:
    # A pool of its own (not the shared `conn`), so nothing else notices the outage.
    database = Database(db_url, max_size=2, timeout=settings.db_timeout_seconds)
    app = make_jobs_api(settings, db=database, provider_factory=FakeProvider)
    api = Api(Client(wsgi_app(app)))
    bound = settings.db_timeout_seconds + 1.5
    try:
        assert api.get("/health").status_code == 200
        pg_cluster.stop()
        try:
            for _ in range(3):
                resp, took = timed(lambda: api.get("/health"))
                assert_error(resp, 503, "unavailable")
                assert resp.headers["Retry-After"].isdigit()
                assert took < bound, took
            resp, took = timed(lambda: api.get("/jobs", alice))
            assert_error(resp, 503, "unavailable")
            assert took < bound
            resp, took = timed(lambda: api.submit(alice))
            assert_error(resp, 503, "unavailable")
            assert took < bound
        finally:
            pg_cluster.start()
        deadline = time.monotonic() + 60
        while True:
            resp = api.get("/health")
            if resp.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert resp.status_code == 200, resp.json
        assert api.submit(alice).status_code == 201
    finally:
        app.close()


class BrokenDb:
    """A database whose every call fails in a way nobody planned for."""

    url = "postgresql://nowhere"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def fetchone(self, *args: Any) -> Any:
        raise self.exc

    def close(self) -> None:
        pass


@pytest.mark.parametrize("exc", [
    RuntimeError("secret-detail-42 in an exception message"),
    SftqError("internal database error: secret-detail-42"),
    KeyError("secret-detail-42"),
])
def test_unexpected_errors_are_a_generic_500_logged_with_traceback(
        settings: Settings, caplog: pytest.LogCaptureFixture, alice: str, exc: Exception) -> None:
    app = make_jobs_api(settings, db=BrokenDb(exc))  # type: ignore[arg-type]
    api = Api(Client(wsgi_app(app)))
    caplog.set_level(logging.INFO)
    for resp in (api.get("/jobs", alice), api.submit(alice), api.get("/health")):
        err = assert_error(resp, 500, "internal")
        assert err == {"error": "internal server error", "code": "internal"}
    logged = [r for r in caplog.records if r.name == "sftq.web"]
    assert len(logged) == 3
    assert all(r.exc_info is not None and r.levelno == logging.ERROR for r in logged)
    assert "GET /jobs" in logged[0].getMessage()


def test_a_database_error_without_our_code_is_500_internal(settings: Settings, db_url: str,
                                                           alice: str) -> None:
    class DivideByZero(Database):
        def fetchone(self, query: str, params: Any = ()) -> Any:
            return super().fetchone("SELECT 1 / 0")

    database = DivideByZero(db_url, timeout=settings.db_timeout_seconds)
    app = make_jobs_api(settings, db=database)
    try:
        api = Api(Client(wsgi_app(app)))
        assert_error(api.get("/jobs", alice), 500, "internal")
    finally:
        app.close()


def test_one_access_line_per_request_without_key_or_payload(
        api: Api, db: Db, alice: str, provider: FakeProvider,
        access_lines: Callable[[], list[dict[str, Any]]], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    job_id = api.enqueue(alice, display_name="secret-display-name")
    api.get("/jobs", alice)
    api.get(f"/jobs/{job_id}", alice)
    api.get("/jobs/analytics/queue", alice)
    api.get("/jobs/nope", alice)
    api.get("/jobs")
    api.post("/jobs", alice, json={"kind": "SFT"})
    db.admit()
    db.submitted(job_id)
    provider.fail = Transient("provider down")
    api.delete(f"/jobs/{job_id}", alice)
    api.get("/health")
    api.request("PUT", "/jobs", key=alice)

    lines = access_lines()
    assert [(ln["method"], ln["route"], ln["status"]) for ln in lines] == [
        ("POST", "/jobs", 201), ("GET", "/jobs", 200), ("GET", "/jobs/{id}", 200),
        ("GET", "/jobs/analytics/queue", 200), ("GET", "/jobs/{id}", 404), ("GET", "/jobs", 401),
        ("POST", "/jobs", 400), ("DELETE", "/jobs/{id}", 202), ("GET", "/health", 200),
        ("PUT", "/jobs", 405),
    ]
    for line in lines:
        assert set(line) == {"fn", "method", "route", "status", "duration_ms", "user", "job_id"}
        assert line["fn"] == "jobs-api"
        assert isinstance(line["duration_ms"], float | int) and line["duration_ms"] >= 0
    assert lines[0]["user"] == alice[:13] and lines[0]["job_id"] == job_id
    assert lines[2]["job_id"] == job_id and lines[7]["job_id"] == job_id
    assert lines[4]["job_id"] is None  # a malformed id is not logged as a job id
    assert lines[5]["user"] is None
    # Nothing logged anywhere carries the key, the payload or its secrets.
    everything = "\n".join(r.getMessage() + str(r.args) for r in caplog.records)
    for secret in (alice, alice[13:], SFT_PAYLOAD["wandbConfig"]["apiKey"],
                   SFT_PAYLOAD["dataset"], "secret-display-name"):
        assert secret not in everything
    assert "provider down" in everything  # the failed stop itself is logged


def test_access_log_lines_are_json(api: Api, alice: str,
                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sftq.access")
    api.get("/jobs", alice)
    [record] = [r for r in caplog.records if r.name == "sftq.access"]
    assert record.levelno == logging.INFO
    assert json.loads(record.getMessage())["route"] == "/jobs"
