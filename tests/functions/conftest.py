"""Fixtures for HTTP-level tests of jobs-api, analytics and the gateway.

Requests go through the real WSGI apps (werkzeug's test client) against a fresh migrated
database per test; the Fireworks provider is a fake injected through provider_factory.
Helpers shared with the test modules live in fn_support.py.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from fn_support import Api, Db, FakeProvider
from pytest_postgresql.janitor import DatabaseJanitor
from werkzeug.test import Client

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.dev.pgcluster import LocalCluster
from sftq_server.http.apps import ApiApp, make_analytics_api, make_jobs_api
from sftq_server.http.gateway import Gateway, make_gateway
from sftq_server.http.web import wsgi_app

_shared_counter = itertools.count()


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(database_url=db_url, db_timeout_seconds=2.0,
                    fireworks_api_key="", fireworks_account_id="")


@pytest.fixture
def database(settings: Settings) -> Iterator[Database]:
    db = Database(settings.database_url, max_size=4, timeout=settings.db_timeout_seconds)
    try:
        yield db
    finally:
        db.close()


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
def jobs_app(settings: Settings, database: Database, provider: FakeProvider) -> Iterator[ApiApp]:
    app = make_jobs_api(settings, db=database, provider_factory=lambda: provider)
    try:
        yield app
    finally:
        app.close()


@pytest.fixture
def api(jobs_app: ApiApp) -> Api:
    return Api(Client(wsgi_app(jobs_app)))


@pytest.fixture
def analytics_app(settings: Settings, database: Database) -> Iterator[ApiApp]:
    app = make_analytics_api(settings, db=database)
    try:
        yield app
    finally:
        app.close()


@pytest.fixture
def analytics(analytics_app: ApiApp) -> Api:
    return Api(Client(wsgi_app(analytics_app)))


@pytest.fixture
def gateway(settings: Settings, provider: FakeProvider,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    monkeypatch.delenv("ANALYTICS_DATABASE_URL", raising=False)
    gw = make_gateway(settings, provider_factory=lambda: provider)
    try:
        yield gw
    finally:
        gw.close()


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> Db:
    return Db(conn)


@pytest.fixture
def alice(db: Db) -> str:
    return db.user("alice")


@pytest.fixture
def bob(db: Db) -> str:
    return db.user("bob")


@pytest.fixture
def access_lines(caplog: pytest.LogCaptureFixture) -> Callable[[], list[dict[str, Any]]]:
    """The sftq.access lines written so far, parsed."""
    caplog.set_level("INFO", logger="sftq.access")

    def lines() -> list[dict[str, Any]]:
        return [json.loads(r.getMessage()) for r in caplog.records if r.name == "sftq.access"]

    return lines


@pytest.fixture(scope="module")
def shared(pg_cluster: LocalCluster, template_db: str) -> Iterator[tuple[Api, str]]:
    """One database, app and key for a whole module, for tests of requests the server refuses
    before anything is stored (cloning a database per case would dominate their run time).
    Tests that look at what got stored use the per-test `api` instead."""
    name = f"shared{os.getpid()}_{next(_shared_counter)}"
    janitor = DatabaseJanitor(user="postgres", host="127.0.0.1", port=pg_cluster.port,
                              dbname=name, template_dbname=template_db)
    janitor.init()
    url = pg_cluster.url_for(name)
    settings = Settings(database_url=url, db_timeout_seconds=2.0)
    app = make_jobs_api(settings, db=Database(url, max_size=2, timeout=2.0),
                        provider_factory=FakeProvider)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            key = Db(conn).user("shared")
        yield Api(Client(wsgi_app(app))), key
    finally:
        app.close()
        janitor.drop()


@pytest.fixture
def sapi(shared: tuple[Api, str]) -> Api:
    return shared[0]


@pytest.fixture
def skey(shared: tuple[Api, str]) -> str:
    return shared[1]
