"""AsyncClient parity: the same behaviour as Client through the same fake, awaited."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
import pytest
from fake_jobs_api import API_KEY, BASE_URL, FakeClock, FakeJobsApi, error

from sftq_client import (
    APIConnectionError,
    AsyncClient,
    Client,
    ConfigurationError,
    Conflict,
    Job,
    NotFound,
    ServiceUnavailable,
    Unauthorized,
    WaitTimeout,
)

T = TypeVar("T")
MakeClient = Callable[..., AsyncClient]


def run(factory: MakeClient, body: Callable[[AsyncClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with factory() as c:
            return await body(c)

    return asyncio.run(main())


def test_public_methods_match_the_sync_client() -> None:
    def public(cls: type) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(member)
            for name, member in vars(cls).items()
            if callable(member) and not name.startswith("_")
        }

    sync, async_ = public(Client), public(AsyncClient)
    assert set(async_) - {"aclose"} == set(sync)
    for name, signature in sync.items():
        assert list(async_[name].parameters) == list(signature.parameters), name


def test_async_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SFTQ_API_KEY", API_KEY)
    monkeypatch.setenv("SUPABASE_URL", "https://example.supabase.co")

    async def main() -> str:
        async with AsyncClient() as c:
            return c.base_url

    assert asyncio.run(main()) == "https://example.supabase.co/functions/v1/jobs-api"
    monkeypatch.delenv("SFTQ_API_KEY")
    with pytest.raises(ConfigurationError):
        AsyncClient()


def test_async_submit_retries_with_one_idempotency_key(
    api: FakeJobsApi, make_async_client: MakeClient, clock: FakeClock
) -> None:
    api.script = [
        error(429, "slow down", "rate_limited", headers={"Retry-After": "3"}),
        httpx.ConnectError("reset"),
    ]
    result = run(make_async_client, lambda c: c.submit("DPO", {"dataset": "d"}, gpu_count=2))
    keys = {r.headers["idempotency-key"] for r in api.requests}
    assert len(api.requests) == 3 and len(keys) == 1
    assert uuid.UUID(keys.pop()).version == 4
    assert clock.sleeps[0] == 3.0 and len(clock.sleeps) == 2
    assert result.kind == "DPO" and len(api.jobs) == 1


def test_async_errors_are_typed(api: FakeJobsApi, make_async_client: MakeClient) -> None:
    with pytest.raises(NotFound):
        run(make_async_client, lambda c: c.get("missing"))
    api.script = [error(401, f"bad key {API_KEY}", "unauthorized")]
    with pytest.raises(Unauthorized) as info:
        run(make_async_client, lambda c: c.list_jobs())
    assert API_KEY not in str(info.value)
    api.script = [error(503, "down", "unavailable")] * 2
    with pytest.raises(ServiceUnavailable):
        run(lambda: make_async_client(max_retries=1), lambda c: c.summary())
    api.script = [httpx.ConnectError("refused")] * 4
    with pytest.raises(APIConnectionError):
        run(make_async_client, lambda c: c.health())


def test_async_paging(api: FakeJobsApi, make_async_client: MakeClient) -> None:
    created = [api.add_job()["id"] for _ in range(5)]

    async def collect(c: AsyncClient) -> list[str]:
        return [job.id async for job in c.iter_jobs(page_size=2)]

    assert run(make_async_client, collect) == list(reversed(created))
    assert len(api.requests) == 3
    page = run(make_async_client, lambda c: c.list_jobs(limit=2))
    assert page.next_cursor == "2"


def test_async_cancel(api: FakeJobsApi, make_async_client: MakeClient) -> None:
    queued, running, done = api.add_job(), api.add_job("PROGRESS"), api.add_job("FAIL")
    assert not run(make_async_client, lambda c: c.cancel(queued["id"])).pending
    assert run(make_async_client, lambda c: c.cancel(running["id"])).pending
    with pytest.raises(Conflict):
        run(make_async_client, lambda c: c.cancel(done["id"]))
    lost = api.add_job()

    def land_then_fail(request: httpx.Request) -> httpx.Response:
        api.route(request)
        raise httpx.ReadError("connection dropped")

    api.script = [land_then_fail]
    assert run(make_async_client, lambda c: c.cancel(lost["id"])).state == "CANCELLED"


def test_async_wait_with_sync_and_async_callbacks(
    api: FakeJobsApi, make_async_client: MakeClient, clock: FakeClock
) -> None:
    job = api.add_job()
    api.state_plan[job["id"]] = ["QUEUED", "PROGRESS", "PROGRESS", "SUCCESS"]
    seen: list[str] = []

    async def on_progress(j: Job) -> None:
        seen.append(j.state)

    result = run(make_async_client, lambda c: c.wait(job["id"], on_progress=on_progress))
    assert result.state == "SUCCESS" and seen == ["QUEUED", "PROGRESS", "PROGRESS", "SUCCESS"]
    assert clock.sleeps == [5.0, 5.0, 7.5]

    other = api.add_job()
    api.state_plan[other["id"]] = ["CANCELLED"]
    plain: list[Job] = []
    result = run(make_async_client, lambda c: c.wait(other["id"], on_progress=plain.append))
    assert result.state == "CANCELLED"


def test_async_wait_timeout(api: FakeJobsApi, make_async_client: MakeClient) -> None:
    job = api.add_job("QUEUED")
    with pytest.raises(WaitTimeout):
        run(make_async_client, lambda c: c.wait(job["id"], poll_interval=1, timeout=3))


def test_async_analytics(api: FakeJobsApi, make_async_client: MakeClient) -> None:
    job = api.add_job("SUCCESS")

    async def all_three(c: AsyncClient) -> tuple[int, int, str]:
        q = await c.queue_context()
        s = await c.summary()
        a = await c.job_analytics(job["id"])
        return q.global_queue_depth, s.total, a.id

    assert run(make_async_client, all_three) == (5, 47, job["id"])
    assert [str(r.url) for r in api.requests] == [
        f"{BASE_URL}/jobs/analytics/queue",
        f"{BASE_URL}/jobs/analytics/summary",
        f"{BASE_URL}/jobs/{job['id']}/analytics",
    ]
