"""The sftq client library and the user CLI against a live `sftq dev` stack (not mocks)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SFT_PAYLOAD, DevStacks, clean_env, run_sftq

from sftq_client import AsyncClient, Client, Conflict, Job, NotFound, Unauthorized


class Live:
    def __init__(self, values: dict[str, str], db_url: str) -> None:
        self.values = values
        self.db_url = db_url
        self.http = httpx.Client(timeout=30)

    @property
    def env(self) -> dict[str, str]:
        return clean_env(SUPABASE_URL=self.values["SUPABASE_URL"],
                         SFTQ_API_KEY=self.values["SFTQ_API_KEY"])

    def client(self, key: str | None = None) -> Client:
        return Client(api_key=key or self.values["SFTQ_API_KEY"],
                      base_url=f"{self.values['SUPABASE_URL']}/functions/v1/jobs-api",
                      max_retries=0)

    def tick(self) -> dict[str, Any]:
        r = self.http.post(f"{self.values['SUPABASE_URL']}/functions/v1/scheduler-tick",
                           headers={"Authorization": f"Bearer {self.values['SFTQ_TICK_SECRET']}"})
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()
        return result

    def finish(self, job: Job, state: str, message: str | None = None) -> None:
        assert job.fireworks_job_name
        collection_and_id = job.fireworks_job_name.split("/", 2)[2]
        body: dict[str, Any] = {"state": state}
        if message:
            body["message"] = message
        r = self.http.post(f"{self.values['SIMULATOR_URL']}/_sim/jobs/{collection_and_id}:finish",
                           json=body)
        assert r.status_code == 200, r.text

    def other_key(self, name: str) -> str:
        created = run_sftq("admin", "create-user", name, "--database-url", self.db_url)
        assert created.returncode == 0, created.stderr
        issued = run_sftq("admin", "issue-key", name, "--database-url", self.db_url)
        assert issued.returncode == 0, issued.stderr
        return issued.stdout.strip()


@pytest.fixture
def live(stacks: DevStacks, db_url: str) -> Iterator[Live]:
    dev = stacks.start(database_url=db_url, tick_interval=0, job_seconds=0)
    stack = Live(dev.wait_ready(), db_url)
    try:
        yield stack
    finally:
        stack.http.close()


def test_client_full_lifecycle(live: Live) -> None:
    seen: list[str] = []
    with live.client() as sftq:
        first = sftq.submit("SFT", SFT_PAYLOAD, display_name="live", gpu_count=4,
                            idempotency_key="live-1")
        again = sftq.submit("SFT", SFT_PAYLOAD, display_name="live", gpu_count=4,
                            idempotency_key="live-1")
        assert again.id == first.id and first.state == "QUEUED"
        with pytest.raises(Conflict):
            sftq.submit("SFT", SFT_PAYLOAD, display_name="changed", idempotency_key="live-1")
        queued = [sftq.submit("DPO", {"dataset": f"d{i}"}).id for i in range(3)]

        assert [j.id for j in sftq.iter_jobs(page_size=2)] == [*reversed(queued), first.id]
        page = sftq.list_jobs(limit=2)
        assert len(page.items) == 2 and page.next_cursor
        assert [j.id for j in sftq.list_jobs(kind="DPO").items] == list(reversed(queued))

        cancelled = sftq.cancel(queued[-1])
        assert cancelled.state == "CANCELLED" and not cancelled.pending
        with pytest.raises(Conflict):
            sftq.cancel(queued[-1])

        assert [str(j) for j in live.tick()["admitted"]] == [str(first.id)]
        running = sftq.get(first.id)
        assert running.state == "PROGRESS" and running.fireworks_job_name
        ctx = sftq.queue_context()
        assert ctx.your_progress_job is not None and ctx.your_progress_job.id == first.id
        assert [j.id for j in ctx.your_queued_jobs] == queued[:2]

        live.finish(running, "JOB_STATE_COMPLETED")
        live.tick()
        done = sftq.wait(first.id, poll_interval=0.05, timeout=30,
                         on_progress=lambda job: seen.append(job.state))
        assert done.state == "SUCCESS" and seen[-1] == "SUCCESS"
        detail = sftq.job_analytics(first.id)
        assert detail.state == "SUCCESS" and detail.run_duration_seconds is not None
        summary = sftq.summary()
        assert summary.by_state["SUCCESS"] == 1 and summary.by_state["CANCELLED"] == 1
        assert summary.total == 4 and summary.success_rate == 0.5


def test_client_errors_and_isolation(live: Live) -> None:
    with live.client() as mine:
        job = mine.submit("RFT", {"dataset": "d", "evaluator": "e"})
    with live.client(live.other_key("mallory")) as theirs:
        for call in (theirs.get, theirs.cancel, theirs.job_analytics):
            with pytest.raises(NotFound):
                call(job.id)
    with live.client("sftq_" + "0" * 48) as nobody, pytest.raises(Unauthorized):
        nobody.list_jobs()


def test_async_client_against_the_stack(live: Live) -> None:
    async def run() -> tuple[str, str, int]:
        async with AsyncClient(api_key=live.values["SFTQ_API_KEY"],
                               base_url=f"{live.values['SUPABASE_URL']}/functions/v1/jobs-api",
                               max_retries=0) as sftq:
            job = await sftq.submit("SFT", SFT_PAYLOAD)
            got = await sftq.get(job.id)
            cancelled = await sftq.cancel(job.id)
            summary = await sftq.summary()
            return got.state, cancelled.state, summary.total

    assert asyncio.run(run()) == ("QUEUED", "CANCELLED", 1)


def test_cli_against_the_stack(live: Live, tmp_path: Path) -> None:
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps(SFT_PAYLOAD))
    env = live.env

    sub = run_sftq("submit", "--kind", "SFT", "--payload", str(payload), "--display-name", "cli",
                   "--json", env=env)
    assert sub.returncode == 0, sub.stderr
    job_id = json.loads(sub.stdout)["id"]

    listed = run_sftq("list", "--json", env=env)
    assert listed.returncode == 0 and [j["id"] for j in json.loads(listed.stdout)] == [job_id]
    table = run_sftq("list", env=env)
    assert table.returncode == 0 and job_id[:8] in table.stdout and "QUEUED" in table.stdout

    missing = run_sftq("get", "00000000-0000-0000-0000-000000000000", env=env)
    assert missing.returncode == 4 and "not found" in missing.stderr.lower()
    bad_key = run_sftq("list", env=clean_env(SUPABASE_URL=live.values["SUPABASE_URL"],
                                             SFTQ_API_KEY="sftq_" + "1" * 48))
    assert bad_key.returncode == 3, bad_key.stderr

    live.tick()
    job = live.client().get(job_id)
    live.finish(job, "JOB_STATE_FAILED", "loss went to NaN")
    live.tick()
    failed = run_sftq("wait", job_id, "--interval", "0.1", env=env)
    assert failed.returncode == 10, failed.stderr
    again = run_sftq("cancel", job_id, env=env)
    assert again.returncode == 5 and "FAIL" in again.stderr

    other = run_sftq("submit", "--kind", "DPO", "--payload", str(payload), "--json", env=env)
    other_id = json.loads(other.stdout)["id"]
    assert run_sftq("cancel", other_id, env=env).returncode == 0
    assert run_sftq("wait", other_id, "--interval", "0.1", env=env).returncode == 11

    summary = run_sftq("analytics", "summary", "--json", env=env)
    assert summary.returncode == 0
    data = json.loads(summary.stdout)
    assert data["by_state"]["FAIL"] == 1
    assert data["recent_failures"][0]["error"] == "loss went to NaN"
    queue = run_sftq("analytics", "queue", "--json", env=env)
    assert queue.returncode == 0 and "global_queue_depth" in json.loads(queue.stdout)


def test_short_ids_case_and_a_wrong_url_against_the_stack(live: Live) -> None:
    env = live.env
    with live.client() as sftq:
        job = sftq.submit("sft", SFT_PAYLOAD)
        assert [j.id for j in sftq.list_jobs(state="queued", kind="sft").items] == [job.id]
        assert sftq.resolve_job_id(job.id[:8]) == job.id
    # The short id `sftq list` shows is what the other commands take.
    short = run_sftq("list", env=env).stdout.splitlines()[1].split()[0]
    assert job.id.startswith(short) and len(short) >= 8
    got = run_sftq("get", short, "--json", env=env)
    assert got.returncode == 0 and json.loads(got.stdout)["id"] == job.id, got.stderr
    # Another user's job is not found by its prefix either.
    other = run_sftq("get", short, env=clean_env(SUPABASE_URL=live.values["SUPABASE_URL"],
                                                SFTQ_API_KEY=live.other_key("oscar")))
    assert other.returncode == 4, other.stderr
    assert run_sftq("cancel", short, env=env).returncode == 0

    # SFTQ_API_URL set to the project's root instead of the jobs-api: a usage error that
    # shows the expected form, not "no such job".
    wrong = clean_env(SFTQ_API_URL=live.values["SUPABASE_URL"],
                      SFTQ_API_KEY=live.values["SFTQ_API_KEY"])
    for argv in (("get", job.id), ("list",)):
        r = run_sftq(*argv, env=wrong)
        assert r.returncode == 2, (argv, r.stderr)
        assert ".../functions/v1/jobs-api" in r.stderr, r.stderr
        assert f"did you mean {live.values['SUPABASE_URL']}/functions/v1/jobs-api?" in r.stderr


def test_cancelling_a_running_job_answers_cancelled_at_once(live: Live) -> None:
    # As docs/client.md and docs/cli.md say: the provider is asked there and then; 202
    # (pending) only when it cannot be reached.
    with live.client() as sftq:
        job = sftq.submit("DPO", {"dataset": "d"})
        live.tick()
        assert sftq.get(job.id).state == "PROGRESS"
        result = sftq.cancel(job.id)
        assert (result.state, result.pending) == ("CANCELLED", False)
    cli = run_sftq("cancel", job.id, env=live.env)
    assert cli.returncode == 5  # already CANCELLED


def test_retry_and_queue_timeout_through_the_client_and_the_cli(
    live: Live, tmp_path: Path
) -> None:
    # Issue 10, done when: retry and the queue timeout work through HTTP, the client and the
    # CLI, here against the real stack (tests/clients/test_sftq_retry.py has the fake server).
    payload = tmp_path / "sft.json"
    payload.write_text(json.dumps(SFT_PAYLOAD))
    env = live.env
    with live.client() as sftq:
        # A running job keeps the user busy (cap 1), so the next one can only wait.
        running = sftq.submit("SFT", SFT_PAYLOAD, display_name="first", gpu_count=2)
        live.tick()
        assert sftq.get(running.id).state == "PROGRESS"

        sub = run_sftq("submit", "--payload", str(payload), "--queue-timeout", "1s", "--json",
                       env=env)  # fmt: skip
        assert sub.returncode == 0, sub.stderr
        waiting = json.loads(sub.stdout)["id"]
        assert sftq.get(waiting).state == "QUEUED"
        time.sleep(1.5)
        live.tick()
        timed_out = sftq.get(waiting)
        assert timed_out.state == "CANCELLED", timed_out
        assert timed_out.error and "timed out in the queue" in timed_out.error
        last = sftq.list_events(waiting)[-1]
        assert (last.type, last.state) == ("queue_timeout", "CANCELLED")
        assert "queue timeout (1 second)" in last.message
        assert run_sftq("wait", waiting, "--interval", "0.1", env=env).returncode == 11

        # sftq retry, by the short id: a new QUEUED job that names the one it retries.
        retried = run_sftq("retry", waiting[:8], env=env)
        assert retried.returncode == 0, retried.stderr
        assert f"a retry of {waiting}" in retried.stdout
        new_id = retried.stdout.split()[1]
        again = sftq.get(new_id)
        assert (again.state, again.kind, again.retry_of) == ("QUEUED", "SFT", waiting)
        shown = run_sftq("get", new_id, env=env)
        assert f"retry_of:            {waiting}" in shown.stdout, shown.stdout

        # Client.retry of a FAIL job: same kind, name and GPUs, at the back of the queue.
        assert sftq.cancel(new_id).state == "CANCELLED"
        live.finish(sftq.get(running.id), "JOB_STATE_FAILED", "loss went to NaN")
        live.tick()
        failed = sftq.get(running.id)
        assert failed.state == "FAIL" and failed.failure_class is not None
        assert "failure_class:" in run_sftq("get", running.id, env=env).stdout
        result = sftq.retry(running.id, idempotency_key="live-retry")
        assert (result.state, result.kind, result.retry_of) == ("QUEUED", "SFT", running.id)
        assert sftq.retry(running.id, idempotency_key="live-retry").id == result.id
        copy = sftq.get(result.id)
        assert (copy.display_name, copy.gpu_count) == ("first", 2)
        with pytest.raises(Conflict):
            sftq.retry(result.id)  # QUEUED: nothing to retry
    refused = run_sftq("retry", result.id, env=env)
    assert refused.returncode == 5 and "job_not_retryable" in refused.stderr, refused.stderr
