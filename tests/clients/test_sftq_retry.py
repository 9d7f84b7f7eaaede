"""Retry and queue timeouts in the client and the CLI: `retry(job_id)`, `sftq retry ID`,
`submit(queue_timeout_seconds=)` and `sftq submit --queue-timeout 6h` (issue 10)."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from fake_jobs_api import API_KEY, BASE_URL, PREFIX, FakeJobsApi, error

from sftq_client import AsyncClient, Client, Conflict, NotFound, RetryResult, cli
from sftq_client.cli.jobs import queue_timeout

Run = Callable[..., tuple[int, str, str]]


class RetryingJobsApi(FakeJobsApi):
    """The fake jobs-api plus POST /jobs/{id}/retry, as docs/api.md specifies it."""

    def __init__(self) -> None:
        super().__init__()
        self.retry_keys: dict[str, str] = {}

    def route(self, request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode("ascii").split("?")[0]
        parts = [unquote(p) for p in path[len(PREFIX) :].split("/") if p]
        if request.method == "POST" and len(parts) == 3 and parts[::2] == ["jobs", "retry"]:
            if request.headers.get("authorization") != f"Bearer {self.api_key}":
                return error(401, "invalid or missing API key", "unauthorized")
            return self._retry(request, parts[1])
        return super().route(request)

    def _retry(self, request: httpx.Request, job_id: str) -> httpx.Response:
        old = self.jobs.get(job_id)
        if old is None:
            return error(404, "job not found", "not_found")
        if old["state"] not in ("FAIL", "CANCELLED"):
            return error(409, f"job is {old['state']}: only a FAIL or CANCELLED job can be "
                         "retried", "job_not_retryable", details={"state": old["state"]})
        key = request.headers.get("idempotency-key", "")
        if key in self.retry_keys:
            new = self.jobs[self.retry_keys[key]]
        else:
            new = self.add_job(kind=old["kind"], display_name=old["display_name"],
                               gpu_count=old["gpu_count"], retry_of=job_id)
            self.retry_keys[key] = new["id"]
        body = {k: new[k] for k in ("id", "kind", "state", "created_at", "retry_of")}
        return httpx.Response(201, json=body)


@pytest.fixture
def api() -> RetryingJobsApi:
    return RetryingJobsApi()


@pytest.fixture
def sftq(
    api: RetryingJobsApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Run:
    monkeypatch.setenv("SFTQ_API_KEY", API_KEY)
    monkeypatch.setenv("SFTQ_API_URL", BASE_URL)
    monkeypatch.setattr(cli, "client_factory",
                        lambda key, url: Client(key, url, transport=api.transport()))

    def run(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


# ---- the client ---------------------------------------------------------------------------


def test_retry_answers_the_new_job_and_keeps_one_key_across_attempts(
    client: Client, api: RetryingJobsApi
) -> None:
    failed = api.add_job("FAIL", kind="DPO", display_name="dpo run", gpu_count=8,
                         failure_class="retryable")
    # The first answer is lost to a 503: the same Idempotency-Key goes again.
    api.script.append(error(503, "down", "unavailable"))
    result = client.retry(failed["id"])
    assert isinstance(result, RetryResult)
    assert (result.kind, result.state, result.retry_of) == ("DPO", "QUEUED", failed["id"])
    posts = api.calls("POST")
    assert len(posts) == 2
    assert posts[0].headers["idempotency-key"] == posts[1].headers["idempotency-key"]
    assert posts[0].url.path.endswith(f"/jobs/{failed['id']}/retry")
    new = client.get(result.id)
    assert new.retry_of == failed["id"] and new.display_name == "dpo run" and new.gpu_count == 8
    assert client.get(failed["id"]).failure_class == "retryable"


def test_retry_of_a_job_that_did_not_end_badly_is_a_conflict(
    client: Client, api: RetryingJobsApi
) -> None:
    done = api.add_job("SUCCESS")
    with pytest.raises(Conflict) as caught:
        client.retry(done["id"])
    assert caught.value.code == "job_not_retryable"
    with pytest.raises(NotFound):
        client.retry("00000000-0000-4000-8000-000000000000")


def test_submit_sends_queue_timeout_seconds_only_when_given(
    client: Client, api: RetryingJobsApi
) -> None:
    client.submit("SFT", {"dataset": "d"}, queue_timeout_seconds=3600)
    client.submit("SFT", {"dataset": "d"})
    first, second = (json.loads(r.content) for r in api.calls("POST"))
    assert first["queue_timeout_seconds"] == 3600
    assert "queue_timeout_seconds" not in second


def test_async_client_retries_and_submits_with_a_timeout(
    make_async_client: Callable[..., AsyncClient], api: RetryingJobsApi
) -> None:
    import asyncio

    cancelled = api.add_job("CANCELLED")

    async def go() -> tuple[RetryResult, Any]:
        async with make_async_client() as client:
            retried = await client.retry(cancelled["id"])
            submitted = await client.submit("RFT", {"dataset": "d"}, queue_timeout_seconds=60)
            return retried, submitted

    retried, _ = asyncio.run(go())
    assert retried.retry_of == cancelled["id"]
    assert json.loads(api.calls("POST")[-1].content)["queue_timeout_seconds"] == 60


# ---- the CLI ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("30m", 1800), ("6h", 21600), ("2d", 172800), ("30d", 2592000),
     (" 6H ", 21600)],
)
def test_queue_timeout_durations(text: str, seconds: int) -> None:
    assert queue_timeout(text) == seconds


def test_submit_queue_timeout_flag(sftq: Run, api: RetryingJobsApi, tmp_path: Path) -> None:
    payload = tmp_path / "p.json"
    payload.write_text('{"dataset": "d"}')
    code, out, err = sftq("submit", "--kind", "SFT", "--payload", str(payload),
                          "--queue-timeout", "6h")
    assert code == 0, err
    assert json.loads(api.calls("POST")[0].content)["queue_timeout_seconds"] == 21600
    for bad in ("0", "31d", "6 hours", "-5m", "1.5h", "h"):
        code, _, err = sftq("submit", "--kind", "SFT", "--payload", str(payload),
                            "--queue-timeout", bad)
        assert code == 2 and "--queue-timeout" in err, (bad, err)
    assert len(api.calls("POST")) == 1  # nothing sent for a bad duration


def test_retry_command(sftq: Run, api: RetryingJobsApi) -> None:
    failed = api.add_job("FAIL", error="gave up")
    code, out, err = sftq("retry", failed["id"])
    assert code == 0, err
    new_id = next(j for j in api.jobs if j != failed["id"])
    assert f"queued {new_id} (SFT), a retry of {failed['id']}" in out
    assert f"sftq wait {new_id}" in out
    code, out, _ = sftq("retry", failed["id"], "--json", "--idempotency-key", "again")
    assert code == 0 and json.loads(out)["retry_of"] == failed["id"]


def test_retry_command_errors(sftq: Run, api: RetryingJobsApi) -> None:
    running = api.add_job("PROGRESS")
    code, _, err = sftq("retry", running["id"])
    assert code == 5 and "only a FAIL or CANCELLED job can be retried" in err
    code, _, err = sftq("retry", "00000000-0000-4000-8000-000000000000")
    assert code == 4 and "not found" in err
    assert sftq("retry")[0] == 2


def test_retry_takes_an_id_prefix(sftq: Run, api: RetryingJobsApi) -> None:
    # Issue 18.5: retry, like get, cancel, wait and events, takes 8 or more characters of an id.
    failed = api.add_job("FAIL", id="0f6c1c9e-1a2b-4c3d-8e4f-0123456789ab")
    api.add_job("CANCELLED", id="0f6c1c9f-1a2b-4c3d-8e4f-0123456789ab")
    code, out, err = sftq("retry", "0f6c1c9e")
    assert code == 0, err
    assert f"a retry of {failed['id']}" in out
    assert api.calls("POST")[0].url.path.endswith(f"/jobs/{failed['id']}/retry")
    code, _, err = sftq("retry", "0f6c1c9")  # 7 characters: too short, nothing is sent
    assert code == 2 and "at least its first 8 characters" in err
    assert len(api.calls("POST")) == 1


def test_retry_and_wait(sftq: Run, api: RetryingJobsApi) -> None:
    failed = api.add_job("FAIL")
    original = api.add_job

    def add_job(*args: Any, **kwargs: Any) -> dict[str, Any]:
        job = original(*args, **kwargs)
        api.state_plan[job["id"]] = ["QUEUED", "PROGRESS", "SUCCESS"]
        return job

    api.add_job = add_job  # type: ignore[method-assign]
    code, out, err = sftq("retry", failed["id"], "--wait")
    assert code == 0, err
    assert "a retry of" in err and "SUCCESS" in out
