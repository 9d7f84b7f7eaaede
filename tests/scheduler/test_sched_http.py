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
from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.dev.pgcluster import free_port
from sftq_server.provider import FireworksClient
from sftq_server.scheduler.http import (
    TickApp,
    TickSecretError,
    make_tick_app,
    require_tick_secret,
    tick_token,
)

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

    from sftq_server.core.settings import get_settings
    from sftq_server.db import get_database

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


# ---- the short-lived token pg_cron sends, and the minimum secret length --------------------

NOW = 1_800_000_000.0


def _ticks(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM sftq.scheduler_ticks").fetchone()
    assert row is not None
    return int(row[0])


def test_a_fresh_token_runs_a_tick_and_a_stale_or_forged_one_does_not(
        conn: Conn, settings: Settings, database: Database, make_provider: Any) -> None:
    clocked = make_tick_app(settings, db=database, provider_factory=make_provider,
                            clock=lambda: NOW)
    try:
        refused = [
            tick_token(TICK_SECRET, NOW - 121),  # minted too long ago
            tick_token(TICK_SECRET, NOW + 121),  # or too far ahead
            tick_token("another-secret-0123456789abcdefghij", NOW),
            tick_token(TICK_SECRET, NOW).upper(),
            tick_token(TICK_SECRET, NOW)[:-1],
            f"v1.{int(NOW)}.{'0' * 64}",
            tick_token(TICK_SECRET, NOW).replace("v1.", "v2.", 1),
        ]
        for token in refused:
            status, _, body = call(clocked, authorization=f"Bearer {token}")
            assert (status, body["code"]) == (401, "unauthorized"), token
        assert _ticks(conn) == 0
        for minted in (NOW, NOW - 120, NOW + 120):
            token = tick_token(TICK_SECRET, minted)
            status, _, body = call(clocked, authorization=f"Bearer {token}")
            assert status == 200 and body["status"] in ("ok", "skipped"), body
        # The secret itself stays accepted (sftq tick, the ticker, a person's curl).
        assert call(clocked, authorization=BEARER)[0] == 200
        assert _ticks(conn) == 4
    finally:
        clocked.close()


def test_the_token_is_hmac_sha256_of_the_seconds() -> None:
    import hashlib
    import hmac

    token = tick_token("k" * 32, 1_700_000_000.9)
    expected = hmac.new(b"k" * 32, b"1700000000", hashlib.sha256).hexdigest()
    assert token == f"v1.1700000000.{expected}"


@pytest.mark.parametrize("length", [12, 16, 31])
def test_a_short_secret_is_refused_outside_the_dev_stack(
        conn: Conn, settings: Settings, database: Database, make_provider: Any,
        length: int) -> None:
    short = TICK_SECRET[:length]
    weak = Settings(**{**settings.__dict__, "tick_secret": short})
    with pytest.raises(TickSecretError, match="at least 32"):
        require_tick_secret(weak)
    # Built anyway (a host that skipped the check): every request is refused, even the right one.
    app = make_tick_app(weak, db=database, provider_factory=make_provider)
    status, _, body = call(app, authorization=f"Bearer {short}")
    assert status == 503 and body["code"] == "not_configured"
    assert "at least 32" in body["error"] and short not in body["error"]  # never echoed
    assert _ticks(conn) == 0
    # Inside the dev stack (SFTQ_DEV_STACK=1) the length is its own business.
    dev = Settings(**{**weak.__dict__, "dev_stack": True})
    require_tick_secret(dev)
    dev_app = make_tick_app(dev, db=database, provider_factory=make_provider)
    assert call(dev_app, authorization=f"Bearer {short}")[0] == 200
    dev_app.close()
    require_tick_secret(settings)  # 32 characters are enough


def test_hosts_refuse_to_start_with_a_short_secret(monkeypatch: pytest.MonkeyPatch,
                                                   settings: Settings) -> None:
    import functions_framework

    from sftq_server.core.settings import get_settings
    from sftq_server.http import gateway as gateway

    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    monkeypatch.setenv("SFTQ_TICK_SECRET", "only-twenty-characters")
    monkeypatch.delenv("SFTQ_DEV_STACK", raising=False)
    get_settings.cache_clear()
    try:
        with pytest.raises(Exception) as failed:
            functions_framework.create_app(target="scheduler_tick",
                                           source=str(FUNCTIONS / "scheduler_tick.py"))
        assert "at least 32" in str(failed.value) or "at least 32" in repr(failed.value.__cause__)
        sys.modules.pop("scheduler_tick", None)
        with pytest.raises(TickSecretError, match="at least 32"):
            gateway.create_app()
        monkeypatch.setenv("SFTQ_DEV_STACK", "1")
        get_settings.cache_clear()
        gateway.create_app().close()
    finally:
        sys.modules.pop("scheduler_tick", None)
        get_settings.cache_clear()
