"""The scheduler-tick HTTP function: the WSGI app and its functions-framework entry point."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sched_support import API_KEY, TICK_SECRET, RecordingSimulator, create_user, enqueue, state

from sftq_server import db as sql
from sftq_server.db import Database
from sftq_server.pgcluster import free_port
from sftq_server.provider import FireworksClient
from sftq_server.settings import Settings
from sftq_server.tick_http import TickApp, make_tick_app

Conn = psycopg.Connection[Any]
FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"


def call(app: Any, method: str = "POST", authorization: str | None = None
         ) -> tuple[int, dict[str, str], Any]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method, "PATH_INFO": "/", "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "80", "wsgi.input": io.BytesIO(b"{}"), "CONTENT_LENGTH": "2",
        "wsgi.url_scheme": "http",
    }
    if authorization is not None:
        environ["HTTP_AUTHORIZATION"] = authorization
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen["status"], seen["headers"] = int(status.split()[0]), dict(headers)
        return lambda data: None

    body = b"".join(app(environ, start_response))
    assert seen["headers"]["Content-Length"] == str(len(body))
    return seen["status"], seen["headers"], json.loads(body)


@pytest.fixture
def app(settings: Settings, database: Database,
        make_provider: Any) -> Iterator[TickApp]:
    tick_app = make_tick_app(settings, db=database, provider_factory=make_provider)
    yield tick_app
    tick_app.close()


BEARER = f"Bearer {TICK_SECRET}"


def test_post_with_the_secret_runs_a_tick(conn: Conn, app: TickApp) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    status, headers, body = call(app, authorization=BEARER)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert body["status"] == "ok" and body["admitted"] == [str(job_id)]
    assert state(conn, job_id) == "PROGRESS"
    assert API_KEY not in json.dumps(body)


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "HEAD"])
def test_only_post(app: TickApp, method: str) -> None:
    status, headers, body = call(app, method, BEARER)
    assert status == 405 and headers["Allow"] == "POST"
    assert body["code"] == "method_not_allowed"


@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Bearer wrong-secret",
                                           f"Basic {TICK_SECRET}", f"Bearer {TICK_SECRET}x"])
def test_wrong_or_missing_secret(conn: Conn, app: TickApp, authorization: str | None) -> None:
    status, _, body = call(app, authorization=authorization)
    assert status == 401
    assert body == {"error": body["error"], "code": "unauthorized"}
    assert conn.execute("SELECT count(*) FROM sftq.scheduler_ticks").fetchone() == (0,)


def test_refuses_to_run_without_a_secret(settings: Settings, database: Database,
                                         make_provider: Any) -> None:
    open_app = make_tick_app(Settings(**{**settings.__dict__, "tick_secret": ""}), db=database,
                             provider_factory=make_provider)
    status, _, body = call(open_app, authorization="Bearer ")
    assert status == 503 and body["code"] == "not_configured"


def test_skipped_while_another_tick_holds_the_lease(conn: Conn, app: TickApp) -> None:
    conn.execute(sql.TICK_BEGIN, ("someone-else", 30.0))
    status, _, body = call(app, authorization=BEARER)
    assert (status, body) == (200, {"status": "skipped"})


def test_database_unreachable_is_503_with_retry_after(settings: Settings,
                                                      make_provider: Any) -> None:
    nowhere = Database(f"postgresql://postgres@127.0.0.1:{free_port()}/none", timeout=1.0)
    try:
        status, headers, body = call(make_tick_app(settings, db=nowhere,
                                                   provider_factory=make_provider),
                                     authorization=BEARER)
    finally:
        nowhere.close()
    assert status == 503 and body["code"] == "unavailable"
    assert int(headers["Retry-After"]) > 0


def test_provider_not_configured_is_503(settings: Settings, database: Database) -> None:
    bare = make_tick_app(Settings(**{**settings.__dict__, "fireworks_api_key": ""}), db=database)
    status, _, body = call(bare, authorization=BEARER)
    assert status == 503 and body["code"] == "not_configured"


def test_default_provider_comes_from_settings(conn: Conn, sim: RecordingSimulator,
                                              settings: Settings, database: Database) -> None:
    enqueue(conn, create_user(conn, "alice"))
    built = make_tick_app(settings, db=database)
    try:
        status, _, body = call(built, authorization=BEARER)
    finally:
        built.close()
    assert status == 200 and len(body["admitted"]) == 1
    assert sim.requests()[0]["path"].endswith("/quotas/training-h200-count")


@pytest.fixture
def framework_client(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Iterator[Any]:
    import functions_framework

    from sftq_server.db import get_database
    from sftq_server.settings import get_settings

    for key, value in {"DATABASE_URL": settings.database_url, "SFTQ_TICK_SECRET": TICK_SECRET,
                       "FIREWORKS_BASE_URL": settings.fireworks_base_url,
                       "FIREWORKS_API_KEY": API_KEY,
                       "FIREWORKS_ACCOUNT_ID": settings.fireworks_account_id}.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    app = functions_framework.create_app(target="scheduler_tick",
                                         source=str(FUNCTIONS / "scheduler_tick.py"))
    try:
        yield app.test_client()
    finally:
        module = sys.modules.pop("scheduler_tick", None)
        if module is not None and module._app is not None:
            module._app.close()
        get_database(settings.database_url).close()
        get_settings.cache_clear()


def test_functions_framework_entry_point(conn: Conn, framework_client: Any) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    assert framework_client.get("/").status_code == 405
    denied = framework_client.post("/", json={})
    assert denied.status_code == 401 and denied.get_json()["code"] == "unauthorized"
    answer = framework_client.post("/", json={}, headers={"Authorization": BEARER})
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["admitted"] == [str(job_id)]
    assert answer.headers["Content-Type"] == "application/json"


def test_provider_factory_is_called_once(settings: Settings, database: Database,
                                         make_provider: Any) -> None:
    made: list[FireworksClient] = []

    def factory() -> FireworksClient:
        made.append(make_provider())
        return made[-1]

    tick_app = make_tick_app(settings, db=database, provider_factory=factory)
    for _ in range(3):
        assert call(tick_app, authorization=BEARER)[0] == 200
    assert len(made) == 1
