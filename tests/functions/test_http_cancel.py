"""DELETE /jobs/{id}: QUEUED at once, PROGRESS through the provider, a provider outage answered
202 and finished later, terminal jobs 409, other users' jobs 404."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fn_support import Api, Db, FakeProvider, assert_error
from werkzeug.test import Client

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.http.apps import make_jobs_api
from sftq_server.http.routes.jobs import CANCEL_PENDING_MESSAGE
from sftq_server.http.web import wsgi_app
from sftq_server.provider import FireworksClient, Rejected, Transient
from sftq_server.simulator import Simulator, SimulatorServer

RFT_PAYLOAD = {"dataset": "d", "evaluator": "e",
               "inferenceParameters": {"responseCandidatesCount": 4}}
JOB_KEYS = {"id", "kind", "state", "display_name", "gpu_count", "created_at", "started_at",
            "completed_at", "error", "fireworks_job_name",
            # Added since the contract (new fields are only added): issue 10.
            "failure_class", "retry_of", "warnings", "estimated_cost",
            # Issue 53: pipelines and run limits.
            "after", "max_run_seconds", "stalled", "stalled_since"}


def running_job(api: Api, db: Db, key: str, kind: str = "SFT") -> tuple[str, str]:
    job_id = api.enqueue(key, kind)
    assert job_id in db.admit()
    return job_id, db.submitted(job_id, kind)


def test_cancel_queued_is_immediate_and_calls_no_provider(api: Api, db: Db, alice: str,
                                                          provider: FakeProvider) -> None:
    job_id = api.enqueue(alice)
    resp = api.delete(f"/jobs/{job_id}", alice)
    assert resp.status_code == 200
    job = resp.json
    assert set(job) == JOB_KEYS  # type: ignore[arg-type]
    assert job["id"] == job_id and job["state"] == "CANCELLED"  # type: ignore[index]
    assert job["completed_at"] is not None and job["started_at"] is None  # type: ignore[index]
    assert provider.calls == []
    assert db.state(job_id) == "CANCELLED"
    assert api.get(f"/jobs/{job_id}", alice).json == job


@pytest.mark.parametrize(("kind", "collection"), [
    ("SFT", "supervisedFineTuningJobs"), ("DPO", "dpoJobs"), ("RFT", "reinforcementFineTuningJobs"),
])
def test_cancel_progress_stops_the_provider_job_then_cancels(
        api: Api, db: Db, alice: str, provider: FakeProvider, kind: str, collection: str) -> None:
    job_id, name = running_job(api, db, alice, kind)
    assert name.startswith(f"accounts/a/{collection}/")
    resp = api.delete(f"/jobs/{job_id}", alice)
    assert resp.status_code == 200, resp.json
    assert resp.json["state"] == "CANCELLED"  # type: ignore[index]
    assert resp.json["fireworks_job_name"] == name  # type: ignore[index]
    assert provider.calls == [(kind, name.rsplit("/", 1)[-1])]
    assert db.state(job_id) == "CANCELLED"
    events = [r[0] for r in db.conn.execute(
        "SELECT event FROM sftq.job_events WHERE job_id = %s ORDER BY id", (job_id,))]
    assert events[-2:] == ["cancel_requested", "cancelled"]


def test_the_provider_id_is_the_last_segment_of_the_job_name(api: Api, db: Db, alice: str,
                                                             provider: FakeProvider) -> None:
    job_id = api.enqueue(alice, "DPO")
    db.admit()
    db.conn.execute("SELECT sftq.record_submitted(%s, 'accounts/a/dpoJobs/adopted-7', NULL)",
                    (job_id,))
    assert api.delete(f"/jobs/{job_id}", alice).status_code == 200
    assert provider.calls == [("DPO", "adopted-7")]


@pytest.mark.parametrize("failure", [
    Transient("DELETE ...: timed out"),
    Transient("HTTP 503", status=503),
    Rejected("HTTP 403", status=403),
    RuntimeError("anything else"),
])
def test_provider_failure_answers_202_and_the_cancel_completes_later(
        api: Api, db: Db, alice: str, provider: FakeProvider, failure: Exception) -> None:
    job_id, _ = running_job(api, db, alice)
    provider.fail = failure
    resp = api.delete(f"/jobs/{job_id}", alice)
    assert resp.status_code == 202
    body = resp.json
    assert body["state"] == "PROGRESS" and body["id"] == job_id  # type: ignore[index]
    assert body["message"] == CANCEL_PENDING_MESSAGE  # type: ignore[index]
    assert set(body) == JOB_KEYS | {"message"}  # type: ignore[arg-type]
    assert db.state(job_id) == "PROGRESS"
    assert db.one("SELECT cancel_requested_at IS NOT NULL FROM sftq.jobs WHERE id = %s", job_id)

    # The scheduler's next tick stops it at the provider and finishes the cancel.
    assert db.one("SELECT sftq.complete_cancel(%s)", job_id) == "CANCELLED"
    assert api.get(f"/jobs/{job_id}", alice).json["state"] == "CANCELLED"  # type: ignore[index]
    assert_error(api.delete(f"/jobs/{job_id}", alice), 409, "job_terminal")


def test_a_repeated_delete_finishes_the_cancel_once_the_provider_is_back(
        api: Api, db: Db, alice: str, provider: FakeProvider) -> None:
    job_id, _ = running_job(api, db, alice)
    provider.fail = Transient("down")
    assert api.delete(f"/jobs/{job_id}", alice).status_code == 202
    provider.fail = None
    resp = api.delete(f"/jobs/{job_id}", alice)
    assert resp.status_code == 200 and resp.json["state"] == "CANCELLED"  # type: ignore[index]
    assert len(provider.calls) == 2
    # One cancel_requested event however many DELETEs it took.
    assert db.one("SELECT count(*) FROM sftq.job_events WHERE job_id = %s"
                  " AND event = 'cancel_requested'", job_id) == 1


def test_cancel_of_an_admitted_but_unsubmitted_job_is_deferred(api: Api, db: Db, alice: str,
                                                               provider: FakeProvider) -> None:
    job_id = api.enqueue(alice)
    db.admit()
    resp = api.delete(f"/jobs/{job_id}", alice)
    assert resp.status_code == 202
    assert resp.json["state"] == "PROGRESS"  # type: ignore[index]
    assert resp.json["message"] == CANCEL_PENDING_MESSAGE  # type: ignore[index]
    # Only the scheduler talks to the provider before the create is recorded.
    assert provider.calls == []
    # When the create lands, the scheduler learns it must stop the job.
    assert db.one("SELECT sftq.record_submitted(%s, 'accounts/a/supervisedFineTuningJobs/x')",
                  job_id) == "stop"


@pytest.mark.parametrize(("provider_state", "final"), [
    ("JOB_STATE_COMPLETED", "SUCCESS"), ("JOB_STATE_FAILED", "FAIL"),
    ("JOB_STATE_CANCELLED", "CANCELLED"),
])
def test_cancel_of_a_terminal_job_is_409(api: Api, db: Db, alice: str, provider: FakeProvider,
                                         provider_state: str, final: str) -> None:
    job_id, _ = running_job(api, db, alice)
    db.provider_state(job_id, provider_state, "boom")
    for _ in range(2):  # repeat cancels change nothing and keep answering 409
        err = assert_error(api.delete(f"/jobs/{job_id}", alice), 409, "job_terminal")
        assert err["details"] == {"state": final}
        assert final in err["error"]
    assert db.state(job_id) == final
    assert provider.calls == []


def test_cancel_of_another_users_job_is_404_and_changes_nothing(
        api: Api, db: Db, alice: str, bob: str, provider: FakeProvider) -> None:
    bobs_running, _ = running_job(api, db, bob)
    alices_queued = api.enqueue(alice)
    assert_error(api.delete(f"/jobs/{bobs_running}", alice), 404, "not_found")
    assert_error(api.delete(f"/jobs/{alices_queued}", bob), 404, "not_found")
    assert db.state(bobs_running) == "PROGRESS"
    assert db.state(alices_queued) == "QUEUED"
    assert db.one("SELECT cancel_requested_at FROM sftq.jobs WHERE id = %s", bobs_running) is None
    assert provider.calls == []


def test_without_provider_settings_a_running_cancel_is_202(settings: Settings, database: Database,
                                                           db: Db, alice: str) -> None:
    app = make_jobs_api(settings, db=database)  # the default factory: FIREWORKS_* are unset
    try:
        api = Api(Client(wsgi_app(app)))
        job_id, _ = running_job(api, db, alice)
        resp = api.delete(f"/jobs/{job_id}", alice)
        assert resp.status_code == 202 and resp.json["state"] == "PROGRESS"  # type: ignore[index]
    finally:
        app.close()


def test_the_default_provider_client_stops_the_job_at_the_simulator(
        settings: Settings, database: Database, db: Db, alice: str) -> None:
    """The lazily built FireworksClient, configured from settings, really calls the provider."""
    sim = Simulator(account_id="acct", job_seconds=0)
    with SimulatorServer(sim) as server:
        cfg = replace(settings, fireworks_base_url=server.url, fireworks_api_key="fw-test-key",
                      fireworks_account_id="acct")
        app = make_jobs_api(cfg, db=database)
        try:
            api = Api(Client(wsgi_app(app)))
            jobs: list[tuple[str, str]] = []
            for kind, user in (("SFT", alice), ("RFT", db.user("carol"))):
                job_id = api.enqueue(user, kind)
                db.admit()
                provider_id = f"sftq-{job_id.replace('-', '')}"
                with FireworksClient(base_url=server.url, api_key="k", account_id="acct") as fw:
                    # Each kind its own body: the simulator, like Fireworks, refuses an RFT
                    # body's fields on an SFT job.
                    body = RFT_PAYLOAD if kind == "RFT" else {"dataset": "d"}
                    created = fw.create_job(kind, provider_id, body, gpu_count=4)
                db.conn.execute("SELECT sftq.record_submitted(%s, %s)", (job_id, created.name))
                jobs.append((job_id, user))
            for job_id, user in jobs:
                resp = api.delete(f"/jobs/{job_id}", user)
                assert resp.status_code == 200, resp.json
                assert resp.json["state"] == "CANCELLED"  # type: ignore[index]
            calls = [(r["method"], r["path"]) for r in sim.requests()]
            assert any(m == "DELETE" and "supervisedFineTuningJobs/sftq-" in p for m, p in calls)
            assert any(m == "POST" and p.endswith(":cancel") for m, p in calls)
        finally:
            app.close()
