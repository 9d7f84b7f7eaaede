"""Fixtures for scheduler tests: ticks against the simulator on loopback, a fresh database
per test (tests/conftest.py), and everything closed at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sched_support import ACCOUNT, API_KEY, TICK_SECRET, RecordingSimulator

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.provider import FireworksClient
from sftq_server.scheduler.tick import run_tick
from sftq_server.simulator import SimulatorServer


@pytest.fixture
def sim() -> RecordingSimulator:
    # job_seconds=0: simulated jobs run until a test finishes them, so nothing depends on timing.
    return RecordingSimulator(account_id=ACCOUNT, job_seconds=0, max_value=64, seed=7)


@pytest.fixture
def sim_server(sim: RecordingSimulator) -> Iterator[SimulatorServer]:
    with SimulatorServer(sim) as server:
        yield server


@pytest.fixture
def make_provider(sim_server: SimulatorServer) -> Iterator[Callable[..., FireworksClient]]:
    made: list[FireworksClient] = []

    def make(**overrides: Any) -> FireworksClient:
        options: dict[str, Any] = {"base_url": sim_server.url, "api_key": API_KEY,
                                   "account_id": ACCOUNT, "timeout": 5.0}
        options.update(overrides)
        client = FireworksClient(**options)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def provider(make_provider: Callable[..., FireworksClient]) -> FireworksClient:
    return make_provider()


@pytest.fixture
def settings(db_url: str, sim_server: SimulatorServer) -> Settings:
    return Settings(database_url=db_url, tick_secret=TICK_SECRET,
                    fireworks_base_url=sim_server.url, fireworks_api_key=API_KEY,
                    fireworks_account_id=ACCOUNT, fireworks_timeout_seconds=5.0,
                    usage_grace_seconds=300.0, tick_lease_seconds=30.0,
                    # No backoff between create attempts unless a test asks for one: the
                    # tests below tick back to back, and the backoff has tests of its own.
                    submit_backoff_seconds=0.0)


@pytest.fixture
def database(db_url: str) -> Iterator[Database]:
    db = Database(db_url, max_size=8, timeout=5.0)
    yield db
    db.close()


@pytest.fixture
def tick(database: Database, provider: FireworksClient,
         settings: Settings) -> Callable[..., dict[str, Any]]:
    """Run one tick in-process; keyword arguments override settings fields."""

    def run(**overrides: Any) -> dict[str, Any]:
        s = settings if not overrides else Settings(**{**settings.__dict__, **overrides})
        return run_tick(database, provider, s, holder="test")

    return run
