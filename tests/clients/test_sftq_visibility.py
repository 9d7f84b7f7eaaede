"""Client and CLI for the visibility features: a job's events, the queue's capacity, the waiting
fields of the analytics, and `sftq wait`'s live line on a terminal."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fake_jobs_api import API_KEY, BASE_URL, FakeClock, FakeJobsApi, iso

from sftq_client import AsyncClient, Client, Job, NotFound, cli
from sftq_client.cli import live as cli_live

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def sftq(api: FakeJobsApi, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> Run:
    monkeypatch.setenv("SFTQ_API_KEY", API_KEY)
    monkeypatch.setenv("SFTQ_API_URL", BASE_URL)
    monkeypatch.setattr(cli, "client_factory",
                        lambda key, url: Client(key, url, transport=api.transport()))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def history(api: FakeJobsApi, n: int) -> dict[str, Any]:
    job = api.add_job()
    api.add_event(job["id"], "queued", "QUEUED", "Queued: waiting for admission.")
    for i in range(1, n):
        api.add_event(job["id"], "provider_state", "QUEUED", f"step {i}", progress_percent=i)
    return job


# ---- client ------------------------------------------------------------------------------------


def test_list_events_follows_every_page(api: FakeJobsApi, client: Client) -> None:
    job = history(api, 250)
    events = client.list_events(job["id"])
    assert [e.id for e in events] == [str(i) for i in range(1, 251)]
    assert events[0].type == "queued" and events[0].state == "QUEUED"
    assert events[0].created_at.tzinfo is not None and events[5].data == {"progress_percent": 5}
    pages = [dict(r.url.params) for r in api.requests]
    assert pages == [{"limit": "100"}, {"limit": "100", "after": "100"},
                     {"limit": "100", "after": "200"}]
    assert str(api.requests[0].url).startswith(f"{BASE_URL}/jobs/{job['id']}/events")
    with pytest.raises(NotFound):
        client.list_events("missing")


def test_list_events_stops_if_the_server_repeats_a_page(api: FakeJobsApi,
                                                        client: Client) -> None:
    job = api.add_job()
    page = {"data": [{"id": "1", "job_id": job["id"], "type": "queued", "state": "QUEUED",
                      "message": "m", "created_at": iso(datetime.now(UTC)), "data": {}}],
            "has_more": True}
    api.script = [httpx.Response(200, json=page), httpx.Response(200, json=page)]
    assert [e.id for e in client.list_events(job["id"])] == ["1", "1"]
    assert len(api.requests) == 2


def test_async_events_and_capacity(api: FakeJobsApi) -> None:
    job = history(api, 120)

    async def go() -> tuple[int, Any]:
        async with AsyncClient(API_KEY, BASE_URL, transport=api.transport()) as c:
            return len(await c.list_events(job["id"])), await c.capacity()

    n, capacity = asyncio.run(go())
    assert n == 120 and capacity.free_gpus == 23


def test_capacity(client: Client, api: FakeJobsApi) -> None:
    c = client.capacity()
    assert (c.quota.id, c.quota.limit, c.quota.usage) == ("training-h200-count", 64, 40.5)
    assert c.free_gpus == 23 and (c.running.jobs, c.queued.gpus) == (3, 24)
    assert [u.name for u in c.users] == ["ann", "others"] and c.users[1].cap is None
    assert c.scheduler.healthy and c.scheduler.interval_seconds == 30
    assert str(api.requests[0].url) == f"{BASE_URL}/capacity"


def test_waiting_fields_parse_and_old_servers_still_work(api: FakeJobsApi,
                                                         client: Client) -> None:
    job = api.add_job()
    api.analytics_extra[job["id"]] = {
        "queue_position": 3,
        "waiting_reason": {"code": "does_not_fit", "message": "needs 8 GPUs while 4 are free"},
        "estimated_start_at": "2026-05-01T12:00:00.000000Z",
        "estimated_finish_at": None,
        "estimate": {"basis": "simulated"},
        "provider_state": None, "progress": None, "estimated_cost": None,
        "a_field_from_the_future": 1,
    }
    a = client.job_analytics(job["id"])
    assert a.queue_position == 3 and a.waiting_reason is not None
    assert a.waiting_reason.code == "does_not_fit" and a.estimate is not None
    assert a.estimated_start_at == datetime(2026, 5, 1, 12, tzinfo=UTC)
    # The queue's items without the new fields (an older server) still parse.
    q = client.queue_context()
    assert q.your_queued_jobs[0].waiting_reason is None


# ---- CLI ---------------------------------------------------------------------------------------


def test_events_table_and_json(sftq: Run, api: FakeJobsApi) -> None:
    job = history(api, 3)
    code, out, err = sftq("events", job["id"])
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "TIME", "TYPE", "STATE", "MESSAGE"]
    assert lines[1].split()[0] == "1" and "Queued: waiting for admission." in lines[1]
    assert len(lines) == 4
    code, out, _ = sftq("events", job["id"], "--json")
    data = json.loads(out)
    assert [e["type"] for e in data] == ["queued", "provider_state", "provider_state"]
    assert set(data[0]) == {"id", "job_id", "type", "state", "message", "created_at", "data"}
    assert sftq("events", "missing")[0] == 4
    empty = api.add_job()
    assert sftq("events", empty["id"])[1] == "no events\n"


def test_capacity_text_and_json(sftq: Run) -> None:
    code, out, _ = sftq("capacity")
    assert code == 0
    assert "training-h200-count: limit 64, usage 40.5" in out
    assert "free GPUs:" in out and "3 jobs, 40 GPUs" in out and "healthy" in out
    header = next(line for line in out.splitlines() if line.startswith("USER"))
    assert header.split() == ["USER", "CAP", "RUNNING", "RUNNING", "GPUS", "QUEUED", "QUEUED",
                              "GPUS"]
    assert any(line.split()[:2] == ["others", "-"] for line in out.splitlines())
    code, out, _ = sftq("capacity", "--json")
    assert json.loads(out)["free_gpus"] == 23


@pytest.fixture
def tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_stderr_is_tty", lambda: True)
    monkeypatch.setattr(cli_live, "terminal_width", lambda: 250)


def test_wait_live_line_shows_reason_position_estimate_then_progress(
        sftq: Run, api: FakeJobsApi, tty: None, clock: FakeClock) -> None:
    job = api.add_job()
    start = datetime.now(UTC) + timedelta(minutes=25)
    queued = {"queue_position": 3, "estimated_start_at": iso(start),
              "waiting_reason": {"code": "behind_own_running_job",
                                 "message": "You have 1 running job and may run 1 at a time"},
              "estimate": {"basis": "simulated"}}
    running = {"provider_state": "JOB_STATE_RUNNING",
               "progress": {"percent": 42, "epoch": 2},
               "estimated_finish_at": iso(datetime.now(UTC) + timedelta(hours=1)),
               "estimate": {"basis": "progress"}}
    api.state_plan[job["id"]] = ["QUEUED", "QUEUED", "QUEUED", "PROGRESS", "PROGRESS",
                                 "SUCCESS"]
    real_route = api.route

    def route(request: httpx.Request) -> httpx.Response:
        # The analytics follow the job: queue fields while QUEUED, progress while PROGRESS.
        if request.url.path.endswith("/analytics"):
            state = api.jobs[job["id"]]["state"]
            api.analytics_extra[job["id"]] = queued if state == "QUEUED" else running
        return real_route(request)

    api.route = route  # type: ignore[method-assign]
    code, out, err = sftq("wait", job["id"], "--interval", "30")
    assert code == 0
    lines = [chunk for chunk in err.split("\r\x1b[K") if chunk]
    assert len(lines) == 6
    q = lines[0]
    assert f"{job['id']}  QUEUED" in q and "3 ahead" in q
    assert "starts ~" in q and ("(in 24m, estimate)" in q or "(in 25m, estimate)" in q)
    assert "You have 1 running job" in q
    # What the estimate rests on comes last, where the terminal has room for it.
    assert q.endswith("(estimate: simulated)"), q
    p = lines[3]
    assert "PROGRESS" in p and "RUNNING 42% epoch 2" in p and "ends ~" in p
    assert f"{job['id']}  SUCCESS" in lines[-1]
    # Refreshed at least every 5 s on a terminal, whatever --interval says.
    assert clock.sleeps and max(clock.sleeps) <= 5
    assert "state:" in out


def test_wait_line_without_analytics_is_the_state_alone(
        sftq: Run, api: FakeJobsApi, tty: None) -> None:
    job = api.add_job()
    api.state_plan[job["id"]] = ["QUEUED", "SUCCESS"]
    real = api.route

    def no_analytics(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/analytics"):
            return httpx.Response(404, json={"error": "no such route", "code": "not_found"})
        return real(request)

    api.route = no_analytics  # type: ignore[method-assign]
    code, _, err = sftq("wait", job["id"])
    assert code == 0 and f"{job['id']}  QUEUED  (waiting" in err


@pytest.mark.parametrize("on_tty", [True, False])
def test_ctrl_c_during_wait_says_the_job_is_unaffected(
        sftq: Run, api: FakeJobsApi, monkeypatch: pytest.MonkeyPatch, on_tty: bool) -> None:
    monkeypatch.setattr(cli, "_stderr_is_tty", lambda: on_tty)
    job = api.add_job()
    calls = {"n": 0}
    real = api.route

    def interrupt_later(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] > 2:
            raise KeyboardInterrupt
        return real(request)

    api.route = interrupt_later  # type: ignore[method-assign]
    code, out, err = sftq("wait", job["id"])
    assert code == 130 and out == ""
    assert (f"stopped waiting; job {job['id']} is unaffected (still QUEUED). "
            f"Resume with: sftq wait {job['id']}") in err
    assert err.endswith("\n")


def test_live_line_fits_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_live, "terminal_width", lambda: 50)
    stream = io.StringIO()
    job = Job.model_validate({"id": "x" * 36, "kind": "SFT", "state": "QUEUED", "gpu_count": 4,
                              "created_at": iso(datetime.now(UTC))})
    status = cli_live.LiveStatus(stream, None)
    status(job)
    status.close()
    line = stream.getvalue().removeprefix("\r\x1b[K").rstrip("\n")
    assert len(line) <= 49 and line.endswith("...")
