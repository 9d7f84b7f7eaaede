"""Fixtures for the provider client and the Fireworks simulator: all on loopback, all stopped."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from sftq_server.provider import FireworksClient
from sftq_server.simulator import Simulator, SimulatorServer

ACCOUNT = "sim-account"
# Long and distinctive, so a leak anywhere is found by a plain substring search.
SECRET_KEY = "fw-SECRET-test-key-0123456789abcdef"


class FakeClock:
    """A monotonic clock the test moves by hand, so job lifecycles need no sleeping."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@pytest.fixture
def api_key() -> str:
    return SECRET_KEY


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def advance(clock: FakeClock) -> Callable[[float], None]:
    """Move the simulator's clock forward by some seconds."""
    return clock.advance


@pytest.fixture
def sim(clock: FakeClock) -> Simulator:
    return Simulator(account_id=ACCOUNT, job_seconds=60.0, max_value=64, clock=clock, seed=1234)


@pytest.fixture
def server(sim: Simulator) -> Iterator[SimulatorServer]:
    with SimulatorServer(sim) as running:
        yield running


@pytest.fixture
def make_client(server: SimulatorServer, api_key: str) -> Iterator[Callable[..., FireworksClient]]:
    """Build clients against the running simulator; every one is closed at teardown."""
    made: list[FireworksClient] = []

    def make(**overrides: object) -> FireworksClient:
        options: dict[str, object] = {
            "base_url": server.url,
            "api_key": api_key,
            "account_id": ACCOUNT,
            "timeout": 5.0,
        }
        options.update(overrides)
        client = FireworksClient(**options)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def client(make_client: Callable[..., FireworksClient]) -> FireworksClient:
    return make_client()


@pytest.fixture(scope="session")
def tls_context() -> ssl.SSLContext:
    # Unused on plain-HTTP loopback, but httpx builds one per client (~70 ms) unless given one.
    return httpx.create_ssl_context()


@pytest.fixture
def http(
    server: SimulatorServer, api_key: str, tls_context: ssl.SSLContext
) -> Iterator[httpx.Client]:
    """A raw HTTP client with a key, for checking the simulator's wire behaviour."""
    with httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=5.0,
        verify=tls_context,
    ) as raw:
        yield raw


def mock_client(
    handler: Callable[[httpx.Request], httpx.Response], **overrides: object
) -> FireworksClient:
    """A client whose HTTP goes to `handler` (httpx.MockTransport); the caller closes it."""
    options: dict[str, object] = {
        "base_url": "https://fireworks.test",
        "api_key": SECRET_KEY,
        "account_id": "acct",
        "timeout": 3.0,
        "transport": httpx.MockTransport(handler),
    }
    options.update(overrides)
    return FireworksClient(**options)


@pytest.fixture
def mocked() -> Iterator[Callable[..., FireworksClient]]:
    made: list[FireworksClient] = []

    def make(
        handler: Callable[[httpx.Request], httpx.Response], **overrides: object
    ) -> FireworksClient:
        built = mock_client(handler, **overrides)
        made.append(built)
        return built

    yield make
    for built in made:
        built.close()
