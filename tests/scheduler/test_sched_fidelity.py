"""Fidelity with what Fireworks really sends (issue 44, item 3), each scripted through the
simulator's /_sim surface over HTTP and met by real ticks: int64 strings in the quota and a
`value` below `maxValue`, paged quotas, the lesser-known job states, jobProgress, and 429s
that back everything off by their Retry-After and never fail a job."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest
from sched_support import (
    RecordingSimulator,
    create_user,
    enqueue,
    events,
    job,
    pid,
    sim_control,
    state,
)

from sftq_server.provider import FireworksClient
from sftq_server.simulator import SimulatorServer

Conn = psycopg.Connection[Any]
Tick = Callable[..., dict[str, Any]]


def _quota_answers(sim: RecordingSimulator) -> list[dict[str, Any]]:
    return [r for r in sim.requests() if r["path"].endswith("/quotas/training-h200-count")]


def test_the_budget_is_the_enforced_value_not_max_value(conn: Conn, sim_server: SimulatorServer,
                                                        tick: Tick) -> None:
    # Fireworks enforces `value`; `maxValue` is only how far it could be raised.
    sim_control(sim_server.url, "/_sim/quota", {"maxValue": 16, "value": 8})
    raw = httpx.get(f"{sim_server.url}/v1/accounts/sim-account/quotas/training-h200-count",
                    headers={"Authorization": "Bearer k"}).json()
    assert (raw["value"], raw["maxValue"], raw["usage"]) == ("8", "16", 0)  # int64 strings
    first = enqueue(conn, create_user(conn, "alice"), gpus=8)
    second = enqueue(conn, create_user(conn, "bob"), gpus=8)
    result = tick()
    assert result["quota"] == {"limit": 8, "value": 8, "max_value": 16, "usage": 0.0}
    assert result["admitted"] == [str(first)]
    assert state(conn, second) == "QUEUED"
    assert job(conn, second)["state"] == "QUEUED"


def test_quotas_are_read_page_by_page(make_provider: Callable[..., FireworksClient],
                                      sim: RecordingSimulator) -> None:
    client = make_provider()
    names = [q.name.rsplit("/", 1)[-1] for q in client.list_quotas(page_size=2)]
    assert "training-h200-count" in names and len(names) == len(set(names)) >= 5
    lists = [r for r in sim.requests() if r["path"].endswith("/quotas")]
    assert len(lists) == -(-len(names) // 2)
    assert all(r["query"]["pageSize"] == "2" for r in lists)
    assert "pageToken" not in lists[0]["query"] and all("pageToken" in r["query"]
                                                        for r in lists[1:])


@pytest.mark.parametrize("provider_state", [
    "JOB_STATE_PAUSED", "JOB_STATE_RE_QUEUEING", "JOB_STATE_VALIDATING",
    "JOB_STATE_CREATING_INPUT_DATASET", "JOB_STATE_DELETING_CLEANING_UP"])
def test_states_that_keep_a_job_running(conn: Conn, sim_server: SimulatorServer, tick: Tick,
                                        provider_state: str) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    tick()
    sim_control(sim_server.url, f"/_sim/jobs/SFT/{pid(job_id)}:state",
                {"state": provider_state, "jobProgress": {"percent": 40, "epoch": 2}})
    tick()
    row = job(conn, job_id)
    assert (row["state"], row["provider_state"]) == ("PROGRESS", provider_state)
    assert (float(row["progress_percent"]), row["progress_epoch"]) == (40.0, 2)
    # Back to its own lifecycle, then done.
    sim_control(sim_server.url, f"/_sim/jobs/SFT/{pid(job_id)}:state",
                {"state": "JOB_STATE_COMPLETED"})
    tick()
    assert state(conn, job_id) == "SUCCESS"


def test_early_stopped_is_a_failure_with_the_provider_message(
        conn: Conn, sim_server: SimulatorServer, tick: Tick) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    tick()
    sim_control(sim_server.url, f"/_sim/jobs/SFT/{pid(job_id)}:state",
                {"state": "JOB_STATE_EARLY_STOPPED", "message": "loss diverged"})
    tick()
    row = job(conn, job_id)
    assert row["state"] == "FAIL" and "loss diverged" in (row["error"] or "")


def test_a_429_on_create_costs_no_attempt_and_its_retry_after_holds_the_next_ticks(
        conn: Conn, sim: RecordingSimulator, sim_server: SimulatorServer, tick: Tick) -> None:
    job_id = enqueue(conn, create_user(conn, "alice"))
    sim_control(sim_server.url, "/_sim/faults", {"rules": [
        {"method": "POST", "path": r"/supervisedFineTuningJobs$", "status": 429, "times": 1,
         "headers": {"Retry-After": "2"}}]})
    result = tick(submit_max_attempts=1, submit_max_seconds=0.0)
    assert result["provider_backoff_until"] is not None
    row = job(conn, job_id)
    assert (row["state"], row["submit_attempts"], row["submitted_at"]) == ("PROGRESS", 0, None)
    assert row["last_submit_error"].startswith("not attempted: the provider is rate limiting us")
    # Inside the Retry-After: this tick sends the provider nothing at all, and with no
    # attempts and no time left the job is still not given up.
    before = len(sim.requests())
    held = tick(submit_max_attempts=1, submit_max_seconds=0.0)
    assert held["provider_calls"] == 0 and len(sim.requests()) == before
    assert state(conn, job_id) == "PROGRESS"
    time.sleep(2.1)
    done = tick(submit_max_attempts=1, submit_max_seconds=0.0)
    assert done["submitted"] == 1, done
    row = job(conn, job_id)
    assert row["submitted_at"] is not None and row["state"] == "PROGRESS"
    assert not [e for e in events(conn, job_id) if e["to_state"] == "FAIL"]


def test_the_account_rate_limit_is_met_with_backoff_not_failures(
        conn: Conn, sim: RecordingSimulator, sim_server: SimulatorServer, tick: Tick) -> None:
    # An account of 3 requests a minute: the first tick's calls run into it.
    users = [create_user(conn, f"u{i}") for i in range(4)]
    jobs = [enqueue(conn, u) for u in users]
    sim_control(sim_server.url, "/_sim/rate_limit", {"rpm": 3})
    first = tick()
    assert any("429" in e for e in first["errors"]), first
    assert first["provider_backoff_until"] is not None
    refused = sim_control(sim_server.url, "/_sim/rate_limit")["refused"]
    assert refused == 1  # one 429, then the tick stopped calling
    assert all(job(conn, j)["state"] in ("QUEUED", "PROGRESS") for j in jobs)
    assert all(job(conn, j)["submit_attempts"] == 0 for j in jobs)
    sim_control(sim_server.url, "/_sim/rate_limit", {"rpm": None})


def test_calls_are_paced_to_the_request_rate(make_provider: Callable[..., FireworksClient]
                                             ) -> None:
    client = make_provider(rpm=600)  # one call every 0.1 s
    started = time.monotonic()
    for _ in range(4):
        client.get_quota()
    assert time.monotonic() - started >= 0.3
