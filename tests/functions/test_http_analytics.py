"""The three analytics routes, field for field as the contract shows them, through jobs-api and
through the separate read-only analytics function (also on a read-only database)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fn_support import Api, Db, assert_error
from werkzeug.test import Client

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.http.apps import ApiApp, make_analytics_api
from sftq_server.http.models import JobAnalytics, QueueContext, Summary
from sftq_server.http.web import wsgi_app

QUEUE_KEYS = {"your_progress_job", "your_queued_jobs", "global_queue_depth",
              "global_progress_count", "global_gpu_in_use"}
PROGRESS_JOB_KEYS = {"id", "display_name", "kind", "gpu_count", "started_at", "fireworks_job_name"}
QUEUED_JOB_KEYS = {"id", "display_name", "kind", "gpu_count", "created_at", "queue_position",
                   # Added by the visibility issue (test_http_visibility.py checks the values).
                   "waiting_reason", "estimated_start_at", "estimate"}
SUMMARY_KEYS = {"total", "by_state", "by_kind", "success_rate", "avg_run_duration_seconds",
                "total_gpu_hours", "recent_failures"}
FAILURE_KEYS = {"id", "display_name", "kind", "gpu_count", "error", "failed_at"}
JOB_ANALYTICS_KEYS = {"id", "display_name", "kind", "state", "gpu_count", "fireworks_job_name",
                      "timeline", "queue_wait_seconds", "run_duration_seconds", "gpu_hours",
                      "error",
                      # Added by the visibility issue (test_http_visibility.py checks them).
                      "queue_position", "waiting_reason", "estimated_start_at",
                      "estimated_finish_at", "estimate", "provider_state", "progress",
                      "estimated_cost"}


def finished(api: Api, db: Db, key: str, state: str, *, gpus: int = 4, wait: float = 90,
             run: float = 3600, message: str | None = None, **fields: Any) -> str:
    """A job of `key`'s that waited `wait` s in the queue and ran `run` s, ending in `state`."""
    job_id = api.enqueue(key, gpu_count=gpus, **fields)
    assert job_id in db.admit(after=wait)
    db.submitted(job_id)
    db.provider_state(job_id, state, message, after=wait + run)
    return job_id


@pytest.fixture(params=["jobs-api", "analytics"])
def client(request: pytest.FixtureRequest, api: Api, analytics: Api) -> Api:
    """Both functions serve the analytics routes with the same answers."""
    return api if request.param == "jobs-api" else analytics


def test_queue_context_of_an_idle_user(client: Api, alice: str) -> None:
    resp = client.get("/jobs/analytics/queue", alice)
    assert resp.status_code == 200
    assert resp.json == {"your_progress_job": None, "your_queued_jobs": [],
                         "global_queue_depth": 0, "global_progress_count": 0,
                         "global_gpu_in_use": 0}


def test_queue_context_shape_and_positions(client: Api, api: Api, db: Db, alice: str,
                                           bob: str) -> None:
    running = api.enqueue(alice, display_name="run", gpu_count=8)
    assert db.admit() == [running]
    name = db.submitted(running)
    b1 = api.enqueue(bob)
    a1 = api.enqueue(alice, "DPO", display_name="second")
    b2 = api.enqueue(bob)
    a2 = api.enqueue(alice, "RFT", gpu_count=2)
    body = client.get("/jobs/analytics/queue", alice).json
    assert isinstance(body, dict) and set(body) == QUEUE_KEYS
    progress = body["your_progress_job"]
    assert set(progress) == PROGRESS_JOB_KEYS
    assert progress["id"] == running and progress["display_name"] == "run"
    assert progress["kind"] == "SFT" and progress["gpu_count"] == 8
    assert progress["fireworks_job_name"] == name and progress["started_at"].endswith("Z")
    queued = body["your_queued_jobs"]
    assert all(set(q) == QUEUED_JOB_KEYS for q in queued)
    assert [(q["id"], q["kind"], q["display_name"], q["gpu_count"], q["queue_position"])
            for q in queued] == [(a1, "DPO", "second", 4, 1), (a2, "RFT", None, 2, 2)]
    assert body["global_queue_depth"] == 4
    assert body["global_progress_count"] == 1
    assert body["global_gpu_in_use"] == 8
    QueueContext.model_validate(body)
    # Bob sees his own jobs only; his positions count alice's earlier jobs.
    bobs = client.get("/jobs/analytics/queue", bob).json
    assert bobs["your_progress_job"] is None  # type: ignore[index]
    assert [(q["id"], q["queue_position"]) for q in bobs["your_queued_jobs"]] == [  # type: ignore[index]
        (b1, 0), (b2, 1)]


def test_summary_with_no_jobs_has_every_key_and_null_rates(client: Api, alice: str) -> None:
    body = client.get("/jobs/analytics/summary", alice).json
    assert body == {"total": 0,
                    "by_state": {"QUEUED": 0, "PROGRESS": 0, "SUCCESS": 0, "FAIL": 0,
                                 "CANCELLED": 0},
                    "by_kind": {"SFT": 0, "DPO": 0, "RFT": 0},
                    "success_rate": None, "avg_run_duration_seconds": None,
                    "total_gpu_hours": 0, "recent_failures": []}


def test_summary_without_terminal_jobs_has_a_null_success_rate(client: Api, api: Api, db: Db,
                                                               alice: str) -> None:
    api.enqueue(alice)
    api.enqueue(alice, "DPO")
    db.admit()
    body = client.get("/jobs/analytics/summary", alice).json
    assert body["success_rate"] is None  # type: ignore[index]
    assert body["by_state"] == {"QUEUED": 1, "PROGRESS": 1, "SUCCESS": 0, "FAIL": 0,  # type: ignore[index]
                                "CANCELLED": 0}
    assert body["by_kind"] == {"SFT": 1, "DPO": 1, "RFT": 0}  # type: ignore[index]


def test_summary_figures(client: Api, api: Api, db: Db, alice: str, bob: str) -> None:
    finished(api, db, alice, "JOB_STATE_COMPLETED", gpus=4, run=3600)
    finished(api, db, alice, "JOB_STATE_COMPLETED", gpus=8, run=1800)
    failed = finished(api, db, alice, "JOB_STATE_FAILED", run=60, message="OOM",
                      display_name="bad run")
    cancelled = api.enqueue(alice, "RFT")
    api.delete(f"/jobs/{cancelled}", alice)
    finished(api, db, bob, "JOB_STATE_FAILED")  # not alice's: never counted
    api.enqueue(alice, "DPO")
    body = client.get("/jobs/analytics/summary", alice).json
    assert isinstance(body, dict) and set(body) == SUMMARY_KEYS
    assert body["total"] == 5
    assert body["by_state"] == {"QUEUED": 1, "PROGRESS": 0, "SUCCESS": 2, "FAIL": 1,
                                "CANCELLED": 1}
    assert body["by_kind"] == {"SFT": 3, "DPO": 1, "RFT": 1}
    assert body["success_rate"] == pytest.approx(0.5)
    assert body["avg_run_duration_seconds"] == 2700
    assert body["total_gpu_hours"] == pytest.approx(4 * 1 + 8 * 0.5)
    [failure] = body["recent_failures"]
    assert set(failure) == FAILURE_KEYS
    assert failure["id"] == failed and failure["error"] == "OOM"
    assert failure["display_name"] == "bad run" and failure["kind"] == "SFT"
    assert failure["gpu_count"] == 4 and failure["failed_at"].endswith("Z")
    Summary.model_validate(body)


def test_summary_lists_the_ten_newest_failures(client: Api, api: Api, db: Db, alice: str) -> None:
    failed = [finished(api, db, alice, "JOB_STATE_FAILED", run=10 + i, message=f"e{i}")
              for i in range(12)]
    body = client.get("/jobs/analytics/summary", alice).json
    assert [f["id"] for f in body["recent_failures"]] == failed[::-1][:10]  # type: ignore[index]
    assert body["success_rate"] == 0  # type: ignore[index]


def test_job_analytics_of_a_queued_job(client: Api, api: Api, alice: str) -> None:
    job_id = api.enqueue(alice, "DPO", display_name="waiting", gpu_count=2)
    body = client.get(f"/jobs/{job_id}/analytics", alice).json
    assert isinstance(body, dict) and set(body) == JOB_ANALYTICS_KEYS
    assert body["id"] == job_id and body["state"] == "QUEUED" and body["kind"] == "DPO"
    assert body["display_name"] == "waiting" and body["gpu_count"] == 2
    assert set(body["timeline"]) == {"queued_at", "started_at", "completed_at"}
    assert body["timeline"]["queued_at"].endswith("Z")
    assert body["timeline"]["started_at"] is None and body["timeline"]["completed_at"] is None
    assert body["queue_wait_seconds"] is None and body["run_duration_seconds"] is None
    assert body["gpu_hours"] is None and body["error"] is None
    assert body["fireworks_job_name"] is None
    JobAnalytics.model_validate(body)


def test_job_analytics_of_a_running_and_a_finished_job(client: Api, api: Api, db: Db,
                                                       alice: str) -> None:
    done = finished(api, db, alice, "JOB_STATE_COMPLETED", gpus=4, wait=90, run=3765)
    body = client.get(f"/jobs/{done}/analytics", alice).json
    assert body["state"] == "SUCCESS"  # type: ignore[index]
    assert body["queue_wait_seconds"] == 90  # type: ignore[index]
    assert body["run_duration_seconds"] == 3765  # type: ignore[index]
    assert body["gpu_hours"] == pytest.approx(4 * 3765 / 3600, abs=0.001)  # type: ignore[index]
    assert body["fireworks_job_name"].endswith(done.replace("-", ""))  # type: ignore[index]
    assert all(v is not None for v in body["timeline"].values())  # type: ignore[index]

    running = api.enqueue(alice)
    db.admit(after=30)
    body = client.get(f"/jobs/{running}/analytics", alice).json
    assert body["queue_wait_seconds"] == 30  # type: ignore[index]
    assert body["run_duration_seconds"] is None and body["gpu_hours"] is None  # type: ignore[index]


def test_job_analytics_of_a_failed_job_shows_the_error(client: Api, api: Api, db: Db,
                                                       alice: str) -> None:
    failed = finished(api, db, alice, "JOB_STATE_FAILED", message="provider said no")
    body = client.get(f"/jobs/{failed}/analytics", alice).json
    assert body["state"] == "FAIL" and body["error"] == "provider said no"  # type: ignore[index]


def test_job_analytics_is_404_for_others_and_unknown_ids(client: Api, api: Api, alice: str,
                                                         bob: str) -> None:
    job_id = api.enqueue(alice)
    for key, target in ((bob, job_id), (alice, str(uuid.uuid4())), (alice, "not-a-uuid")):
        err = assert_error(client.get(f"/jobs/{target}/analytics", key), 404, "not_found")
        assert err["error"] == "job not found"


def test_analytics_needs_a_key(client: Api) -> None:
    for path in ("/jobs/analytics/queue", "/jobs/analytics/summary",
                 f"/jobs/{uuid.uuid4()}/analytics"):
        resp = client.get(path)
        assert_error(resp, 401, "unauthorized")
        assert resp.headers["WWW-Authenticate"] == "Bearer"


def test_the_analytics_function_serves_only_analytics(analytics: Api, alice: str) -> None:
    job = str(uuid.uuid4())
    for method, path in [("GET", "/jobs"), ("POST", "/jobs"), ("GET", f"/jobs/{job}"),
                         ("DELETE", f"/jobs/{job}"), ("GET", "/openapi.json")]:
        assert_error(analytics.request(method, path, key=alice), 404, "not_found")
    assert_error(analytics.request("POST", "/jobs/analytics/summary", key=alice), 405,
                 "method_not_allowed")
    assert analytics.get("/health").status_code == 200


@pytest.fixture
def read_only_url(db_url: str) -> str:
    """The test database as a read replica looks to a client: every transaction read-only."""
    return db_url + "?options=-c%20default_transaction_read_only%3Don"


@pytest.fixture
def replica_analytics(settings: Settings, read_only_url: str,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Api, ApiApp]]:
    monkeypatch.setenv("ANALYTICS_DATABASE_URL", read_only_url)
    # The one Settings object reads the variable, as the function's entry point does.
    from_env = Settings.from_env().analytics_database_url
    app = make_analytics_api(dataclasses.replace(settings, analytics_database_url=from_env))
    try:
        yield Api(Client(wsgi_app(app))), app
    finally:
        app.close()


def test_analytics_reads_from_its_own_read_only_database(
        replica_analytics: tuple[Api, ApiApp], api: Api, db: Db, alice: str,
        read_only_url: str) -> None:
    ro, app = replica_analytics
    assert app.api.db.url == read_only_url
    job_id = api.enqueue(alice)
    # A fresh key has never been used: on a primary the first call would record last_used_at.
    fresh = db.user("dora")
    for key in (alice, fresh):
        assert ro.get("/jobs/analytics/queue", key).status_code == 200
        assert ro.get("/jobs/analytics/summary", key).status_code == 200
    assert ro.get(f"/jobs/{job_id}/analytics", alice).json["id"] == job_id  # type: ignore[index]
    assert_error(ro.get(f"/jobs/{job_id}/analytics", fresh), 404, "not_found")
    assert_error(ro.get("/jobs/analytics/summary", "sftq_" + "1" * 48), 401, "unauthorized")
    db.one("SELECT sftq.revoke_key(%s)", fresh[:13])
    assert_error(ro.get("/jobs/analytics/summary", fresh), 401, "unauthorized")
    assert ro.get("/health").status_code == 200
    assert db.one("SELECT last_used_at FROM sftq.api_keys WHERE prefix = %s", fresh[:13]) is None


def test_analytics_falls_back_to_database_url(settings: Settings,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANALYTICS_DATABASE_URL", raising=False)
    app = make_analytics_api(settings)
    try:
        assert app.api.db.url == settings.database_url
        assert isinstance(app.api.db, Database)
    finally:
        app.close()
