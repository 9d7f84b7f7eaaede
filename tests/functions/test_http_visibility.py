"""Visibility over HTTP: every job by default (streamed when long), every queued job in the queue
analytics with why it waits and when it should start, and the new fields of a job's analytics,
present in every answer (null when there is nothing to say)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from fn_support import Api, Db
from werkzeug.test import Client

from sftq_server.core.errors import Unavailable
from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.http.apps import ApiApp, make_jobs_api
from sftq_server.http.models import JobAnalytics, QueueContext
from sftq_server.http.routes import jobs as api_listing
from sftq_server.http.web import wsgi_app

NEW_ANALYTICS_FIELDS = ("queue_position", "waiting_reason", "estimated_start_at",
                        "estimated_finish_at", "estimate", "provider_state", "progress",
                        "estimated_cost")


def tick(db: Db, seconds_ago: float = 0, limit: int | None = 64, usage: float = 0) -> None:
    """A finished scheduler tick `seconds_ago` that read the quota (limit None: it could not)."""
    at = db.one("SELECT now() - make_interval(secs => %s)", seconds_ago)
    tick_id = db.one("SELECT sftq.tick_begin('test', interval '2 minutes', %s)", at)
    result: dict[str, Any] = {} if limit is None else {"quota_limit": limit, "quota_usage": usage}
    db.one("SELECT sftq.tick_finish(%s, %s::jsonb, %s)", tick_id, json.dumps(result), at)


@pytest.fixture
def make_api(settings: Settings, database: Database) -> Iterator[Any]:
    apps: list[ApiApp] = []

    def make(**overrides: Any) -> Api:
        app = make_jobs_api(dataclasses.replace(settings, **overrides), db=database)
        apps.append(app)
        return Api(Client(wsgi_app(app)))

    yield make
    for app in apps:
        app.api.close()


# --- GET /jobs: all of them --------------------------------------------------------------------

def test_130_jobs_without_limit_are_130_newest_first(api: Api, db: Db, alice: str,
                                                     bob: str) -> None:
    ids = [api.enqueue(alice, "DPO" if i % 3 else "SFT") for i in range(130)][::-1]
    api.enqueue(bob)
    resp = api.get("/jobs", alice)
    assert resp.status_code == 200
    assert [j["id"] for j in resp.json] == ids  # type: ignore[union-attr]
    assert "X-Next-Cursor" not in resp.headers
    # Filters apply to the whole list too.
    dpo = api.get("/jobs?kind=DPO", alice).json
    assert [j["id"] for j in dpo] == [i for i in ids if i in {  # type: ignore[union-attr]
        j["id"] for j in resp.json if j["kind"] == "DPO"}]  # type: ignore[union-attr]
    # With limit: pages as before.
    seen: list[str] = []
    url = "/jobs?limit=50"
    pages = 0
    while url:
        page = api.get(url, alice)
        seen += [j["id"] for j in page.json]  # type: ignore[union-attr]
        pages += 1
        cursor = page.headers.get("X-Next-Cursor")
        url = f"/jobs?limit=50&cursor={cursor}" if cursor else ""
    assert seen == ids and pages == 3


def test_a_long_list_is_streamed_page_by_page(api: Api, db: Db, alice: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_listing, "STREAM_PAGE", 7)
    ids = [api.enqueue(alice) for _ in range(30)][::-1]
    resp = api.get("/jobs", alice)
    assert resp.status_code == 200 and resp.content_type == "application/json"
    # Streamed: no Content-Length (HTTP/1.1 servers send it chunked).
    assert "Content-Length" not in resp.headers
    assert [j["id"] for j in resp.json] == ids  # type: ignore[union-attr]
    # Exactly a page: no trailing empty page, still valid JSON.
    monkeypatch.setattr(api_listing, "STREAM_PAGE", 10)
    assert [j["id"] for j in api.get("/jobs", alice).json] == ids  # type: ignore[union-attr]
    # Short lists are one ordinary body.
    monkeypatch.setattr(api_listing, "STREAM_PAGE", 1000)
    short = api.get("/jobs", alice)
    assert short.headers["Content-Length"] == str(len(short.get_data()))


def test_a_database_failure_mid_stream_never_looks_like_a_complete_list(
        settings: Settings, database: Database, alice: str, api: Api,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_listing, "STREAM_PAGE", 5)
    for _ in range(12):
        api.enqueue(alice)
    calls = {"n": 0}
    real = database.fetchone

    def flaky(query: str, params: Any = ()) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise Unavailable("gone")
        return real(query, params)

    app = make_jobs_api(settings, db=database)
    monkeypatch.setattr(database, "fetchone", flaky)
    client = Client(wsgi_app(app))
    with pytest.raises(Unavailable):
        client.get("/jobs", headers={"Authorization": f"Bearer {alice}"}).get_data()
    # A failure before the first byte is an ordinary error answer.
    calls["n"] = 1
    resp = client.get("/jobs", headers={"Authorization": f"Bearer {alice}"})
    assert resp.status_code == 503


# --- GET /jobs/analytics/queue: every queued job, why it waits, when it starts -----------------

def test_queue_analytics_lists_all_130_queued_jobs(api: Api, db: Db, alice: str) -> None:
    ids = [api.enqueue(alice) for _ in range(130)]
    tick(db)
    body = api.get("/jobs/analytics/queue", alice).json
    QueueContext.model_validate(body)
    queued = body["your_queued_jobs"]  # type: ignore[index]
    assert [q["id"] for q in queued] == ids
    assert [q["waiting_reason"]["code"] for q in queued] == (
        ["next_tick"] + ["behind_own_queued_job"] * 129)
    assert queued[129]["waiting_reason"]["message"].startswith("Behind 129 of your own")
    starts = [datetime.fromisoformat(q["estimated_start_at"]) for q in queued]
    assert starts == sorted(starts) and all(q["estimate"]["basis"] for q in queued)


def test_reasons_and_estimates_over_http(api: Api, db: Db, alice: str, bob: str,
                                         analytics: Api) -> None:
    running = api.enqueue(alice, gpu_count=8)
    db.admit(8)
    db.submitted(running)
    mine = api.enqueue(alice, gpu_count=4)
    other = api.enqueue(bob, gpu_count=16)
    tick(db, limit=16, usage=0)
    for client in (api, analytics):
        body = client.get("/jobs/analytics/queue", alice).json
        (item,) = body["your_queued_jobs"]  # type: ignore[index]
        assert item["waiting_reason"] == {
            "code": "behind_own_running_job",
            "message": "You have 1 running job and may run 1 at a time: this job is admitted "
                       "when one of them ends."}
        assert item["estimated_start_at"] is not None
        assert item["estimate"]["basis"].startswith("simulated strict-FIFO admission")
    theirs = api.get(f"/jobs/{other}/analytics", bob).json
    assert theirs["waiting_reason"]["code"] == "does_not_fit"  # type: ignore[index]
    assert theirs["queue_position"] == 1  # type: ignore[index]
    assert "8 are free" in theirs["waiting_reason"]["message"]  # type: ignore[index]
    # Nothing of alice's shows in bob's answer, nor the reverse.
    assert "alice" not in json.dumps(theirs) and running not in json.dumps(theirs)
    assert mine not in json.dumps(theirs)


def test_every_new_analytics_field_is_present_null_when_nothing_to_say(
        api: Api, db: Db, alice: str) -> None:
    tick(db)
    running = api.enqueue(alice)
    db.admit()
    db.submitted(running)
    queued = api.enqueue(alice)
    cancelled = api.enqueue(alice)
    assert api.delete(f"/jobs/{cancelled}", alice).status_code == 200

    def get(job: str) -> dict[str, Any]:
        body = api.get(f"/jobs/{job}/analytics", alice).json
        JobAnalytics.model_validate(body)
        assert isinstance(body, dict) and all(k in body for k in NEW_ANALYTICS_FIELDS)
        return body

    # Running: a finish estimate and the provider's state; no waiting fields.
    r = get(running)
    assert r["estimated_finish_at"] is not None and r["estimate"]["basis"]
    assert r["provider_state"] == "JOB_STATE_RUNNING"
    assert (r["queue_position"], r["waiting_reason"], r["estimated_start_at"],
            r["progress"], r["estimated_cost"]) == (None, None, None, None, None)
    # What the tick records from the provider (progress, estimated cost) shows as reported.
    db.conn.execute("UPDATE sftq.jobs SET progress_percent = 42.5, progress_epoch = 2, "
                    "estimated_cost = '{\"amount\": \"3.10\", \"currency\": \"USD\"}' "
                    "WHERE id = %s", (running,))
    r = get(running)
    assert r["progress"] == {"percent": 42.5, "epoch": 2}
    assert r["estimated_cost"] == {"amount": "3.10", "currency": "USD"}
    # Queued: position, reason, start estimate; no finish.
    q = get(queued)
    assert q["queue_position"] == 0 and q["waiting_reason"]["code"] == "behind_own_running_job"
    assert q["estimated_start_at"] is not None and q["estimated_finish_at"] is None
    # Finished (and cancelled): nothing to estimate.
    db.provider_state(running, "JOB_STATE_COMPLETED", after=60)
    for job in (running, cancelled):
        f = get(job)
        assert (f["queue_position"], f["waiting_reason"], f["estimated_start_at"],
                f["estimated_finish_at"], f["estimate"]) == (None, None, None, None, None)


def test_the_tick_interval_comes_from_the_apis_environment(make_api: Any, db: Db,
                                                           alice: str) -> None:
    tick(db, seconds_ago=100)
    job = make_api().enqueue(alice)
    # 100 s without a tick: stalled with 30 s ticks (3 intervals = 90 s) ...
    default = make_api().get(f"/jobs/{job}/analytics", alice).json
    assert default["waiting_reason"]["code"] == "scheduler_stalled"  # type: ignore[index]
    assert default["estimated_start_at"] is None  # type: ignore[index]
    # ... not with 60 s ticks (180 s).
    slow = make_api(tick_interval_seconds=60.0).get(f"/jobs/{job}/analytics", alice).json
    assert slow["waiting_reason"]["code"] == "next_tick"  # type: ignore[index]


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SFTQ_TICK_INTERVAL_SECONDS", "7.5")
    monkeypatch.setenv("SFTQ_CAPACITY_SHOW_USERS", "false")
    s = Settings.from_env()
    assert (s.tick_interval_seconds, s.capacity_show_users) == (7.5, False)
    monkeypatch.delenv("SFTQ_TICK_INTERVAL_SECONDS")
    monkeypatch.setenv("SFTQ_CAPACITY_SHOW_USERS", "1")
    s = Settings.from_env()
    assert (s.tick_interval_seconds, s.capacity_show_users) == (30.0, True)


def test_estimates_move_with_the_clock(api: Api, db: Db, alice: str) -> None:
    """The next tick is on the scheduler's grid after now, not a fixed offset."""
    tick(db, seconds_ago=10)
    job = api.enqueue(alice)
    body = api.get(f"/jobs/{job}/analytics", alice).json
    start = datetime.fromisoformat(body["estimated_start_at"])  # type: ignore[index]
    now = db.one("SELECT now()")
    assert timedelta(0) <= start - now <= timedelta(seconds=30)
