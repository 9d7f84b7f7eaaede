"""Fixtures for the webhook tests: the jobs-api in production mode (https and public addresses
only, SFTQ_WEBHOOKS_KEY set) and in dev mode (SFTQ_WEBHOOKS_ALLOW_PRIVATE), loopback receivers,
deliverers, and a resolver that never asks a real DNS server anything.

Shared helpers come from tests/functions/fn_support.py (users, keys, job lifecycles, a keyed
test client) and wh_support.py (receiver, resolver, connector, verification).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "functions"))

from fn_support import Api, Db  # noqa: E402
from werkzeug.test import Client  # noqa: E402
from wh_support import WEBHOOKS_KEY, Connections, FakeResolver, Receiver  # noqa: E402

from sftq_server import webhooks  # noqa: E402
from sftq_server.core.settings import Settings  # noqa: E402
from sftq_server.db import Database  # noqa: E402
from sftq_server.http.apps import ApiApp, make_jobs_api  # noqa: E402
from sftq_server.http.web import wsgi_app  # noqa: E402


@pytest.fixture(autouse=True)
def resolver(monkeypatch: pytest.MonkeyPatch) -> FakeResolver:
    """Every name resolution in these tests goes here (the table starts empty)."""
    fake = FakeResolver()
    monkeypatch.setattr(webhooks.destinations, "default_resolver", fake)
    return fake


@pytest.fixture
def settings(db_url: str) -> Settings:
    """Production mode: https only, public destinations only, secrets sealed."""
    return Settings(database_url=db_url, db_timeout_seconds=2.0, webhooks_key=WEBHOOKS_KEY,
                    tick_secret="deliver-secret-0123456789")


@pytest.fixture
def dev_settings(settings: Settings) -> Settings:
    return dataclasses.replace(settings, webhooks_allow_private=True)


@pytest.fixture
def database(settings: Settings) -> Iterator[Database]:
    db = Database(settings.database_url, max_size=8, timeout=settings.db_timeout_seconds)
    try:
        yield db
    finally:
        db.close()


@pytest.fixture
def make_api(database: Database) -> Iterator[Callable[[Settings], Api]]:
    apps: list[ApiApp] = []

    def make(settings: Settings) -> Api:
        app = make_jobs_api(settings, db=database)
        apps.append(app)
        return Api(Client(wsgi_app(app)))

    yield make
    for app in apps:
        app.api.close()


@pytest.fixture
def api(make_api: Callable[[Settings], Api], settings: Settings) -> Api:
    return make_api(settings)


@pytest.fixture
def dev_api(make_api: Callable[[Settings], Api], dev_settings: Settings) -> Api:
    return make_api(dev_settings)


@pytest.fixture
def db(conn: Any) -> Db:
    return Db(conn)


@pytest.fixture
def alice(db: Db) -> str:
    return db.user("alice")


@pytest.fixture
def bob(db: Db) -> str:
    return db.user("bob")


@pytest.fixture
def make_receiver() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(**kwargs: Any) -> Receiver:
        r = Receiver(**kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


@pytest.fixture
def connections() -> Connections:
    return Connections()


@pytest.fixture
def make_deliverer(database: Database, dev_settings: Settings, connections: Connections,
                   ) -> Callable[..., webhooks.Deliverer]:
    """A deliverer in dev mode (loopback receivers) unless settings= says otherwise; every
    connection goes through `connections`, which refuses anything but loopback."""

    def make(settings: Settings | None = None, **options: Any) -> webhooks.Deliverer:
        options.setdefault("connector", connections)
        return webhooks.Deliverer(database, settings or dev_settings, **options)

    return make
