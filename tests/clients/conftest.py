from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fake_jobs_api import API_KEY, BASE_URL, FakeClock, FakeJobsApi

from sftq_client import AsyncClient, Client, _transport


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(_transport, "sync_sleep", fake.sleep)
    monkeypatch.setattr(_transport, "async_sleep", fake.async_sleep)
    monkeypatch.setattr(_transport, "monotonic", fake.monotonic)
    return fake


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's real credentials must never leak into (or change the outcome of) these tests.
    for name in ("SFTQ_API_KEY", "SFTQ_API_URL", "SUPABASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def api() -> FakeJobsApi:
    return FakeJobsApi()


@pytest.fixture
def client(api: FakeJobsApi) -> Iterator[Client]:
    with Client(API_KEY, BASE_URL, transport=api.transport()) as c:
        yield c


@pytest.fixture
def make_async_client(api: FakeJobsApi) -> Callable[..., AsyncClient]:
    """AsyncClient bound to the fake; build it inside the event loop that uses it."""

    def make(max_retries: int = 3) -> AsyncClient:
        return AsyncClient(API_KEY, BASE_URL, max_retries=max_retries, transport=api.transport())

    return make
