"""The client, the CLI and the MCP tools on the per-user limits' 429s (issue 52): a rate or a
stream slot is waited for as Retry-After says; a queue limit is not retried (waiting alone
does not free it) and comes back with its code; the MCP tools carry the code as tool errors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_jobs_api import API_KEY, BASE_URL, FakeClock, FakeJobsApi, error

from sftq_client import AsyncClient, Client, RateLimited, cli
from sftq_client.mcp.tools import ToolError, call_tool

RATE_HEADERS = {"Retry-After": "7", "RateLimit-Policy": '"default";q=600;w=60',
                "RateLimit": '"default";r=0;t=60'}


def test_rate_limited_is_retried_after_exactly_retry_after(client: Client, api: FakeJobsApi,
                                                           clock: FakeClock) -> None:
    api.script = [error(429, "rate limit: 600 requests a minute", "rate_limited",
                        headers=RATE_HEADERS)]
    job = client.submit("SFT", {"dataset": "d"})
    assert clock.sleeps == [7.0]
    assert len(api.requests) == 2 and job.state == "QUEUED"
    # The retry is the same request: one Idempotency-Key, one job.
    assert len({r.headers["idempotency-key"] for r in api.requests}) == 1 and len(api.jobs) == 1


def test_too_many_streams_is_waited_for_as_told(client: Client, api: FakeJobsApi,
                                                clock: FakeClock) -> None:
    api.script = [error(429, "too many open streams", "too_many_streams",
                        headers={"Retry-After": "10"})] * 2
    client.list_jobs(limit=1)
    assert clock.sleeps == [10.0, 10.0] and len(api.requests) == 3


def test_queue_limit_is_not_retried(client: Client, api: FakeJobsApi, clock: FakeClock) -> None:
    api.script = [error(429, "queue limit: at most 3 QUEUED jobs", "queue_limit",
                        details={"limit": 3, "queued": 3})]
    with pytest.raises(RateLimited) as caught:
        client.submit("SFT", {"dataset": "d"})
    assert caught.value.code == "queue_limit" and "at most 3" in caught.value.message
    assert clock.sleeps == [] and len(api.requests) == 1 and not api.jobs


def test_the_cli_says_the_queue_limit(api: FakeJobsApi, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str], clock: FakeClock,
                                      tmp_path: Path) -> None:
    payload = tmp_path / "sft.json"
    payload.write_text('{"dataset": "d"}')
    monkeypatch.setenv("SFTQ_API_KEY", API_KEY)
    monkeypatch.setenv("SFTQ_API_URL", BASE_URL)
    monkeypatch.setattr(cli, "client_factory",
                        lambda key, url: Client(key, url, transport=api.transport()))
    api.script = [error(429, "queue limit: at most 3 QUEUED jobs", "queue_limit")]
    code = cli.main(["submit", "--payload", str(payload)])
    err = capsys.readouterr().err
    assert code != 0 and "queue limit: at most 3 QUEUED jobs" in err
    assert clock.sleeps == []


def test_mcp_tools_return_the_limits_as_tool_errors_with_the_code(
        api: FakeJobsApi, make_async_client: Callable[..., AsyncClient]) -> None:
    async def submit(client: AsyncClient) -> ToolError:
        with pytest.raises(ToolError) as caught:
            await call_tool(client, "submit_job", {"kind": "SFT",
                                                   "fireworks_payload": {"dataset": "d"}})
        return caught.value

    async def main() -> list[ToolError]:
        out = []
        api.script = [error(429, "queue limit: at most 3 QUEUED jobs", "queue_limit")]
        async with make_async_client() as client:
            out.append(await submit(client))
        api.script = [error(429, "rate limit", "rate_limited", headers=RATE_HEADERS)] * 4
        async with make_async_client(max_retries=3) as client:
            out.append(await submit(client))
        return out

    queue, rate = asyncio.run(main())
    assert (queue.code, queue.status) == ("queue_limit", 429)
    assert (rate.code, rate.status) == ("rate_limited", 429)
