"""The simulator's scripted answers (`POST /_sim/faults` with `rules`) and the lifecycle a
running job passes through (PENDING, RUNNING, WRITING_RESULTS, a percent that grows)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from sftq_server.simulator import LIFECYCLE, Simulator

BASE = "/v1/accounts/sim-account"
SFT = {"dataset": "accounts/a/datasets/d", "baseModel": "m"}
DENIED = {"code": 7, "message": "permission denied on model accounts/other/models/private"}


def _create(http: httpx.Client, job_id: str, body: object = SFT) -> httpx.Response:
    return http.post(
        f"{BASE}/supervisedFineTuningJobs", params={"supervisedFineTuningJobId": job_id}, json=body
    )


def test_a_rule_answers_instead_of_the_simulator_times_times(
    http: httpx.Client, sim: Simulator
) -> None:
    settings = http.post(
        "/_sim/faults",
        json={
            "rules": [
                {
                    "method": "POST",
                    "path": r"/supervisedFineTuningJobs$",
                    "status": 403,
                    "body": DENIED,
                    "times": 1,
                }
            ]
        },
    ).json()
    assert settings["rules"] == [
        {
            "method": "POST",
            "path": r"/supervisedFineTuningJobs$",
            "status": 403,
            "body": DENIED,
            "times": 1,
            "headers": {},
        }
    ]
    refused = _create(http, "r1")
    assert refused.status_code == 403 and refused.json() == DENIED
    assert sim.jobs() == []  # answered instead of the simulator: nothing was applied
    assert http.get("/_sim/faults").json()["rules"][0]["times"] == 0
    # Its one answer spent, the simulator answers again.
    assert _create(http, "r1").status_code == 200
    recorded = http.get("/_sim/requests").json()
    assert [(r["method"], r["fault"]) for r in recorded] == [("POST", "rule"), ("POST", None)]


def test_first_matching_rule_wins_and_the_path_is_searched_without_the_query(
    http: httpx.Client,
) -> None:
    http.post(
        "/_sim/faults",
        json={
            "rules": [
                # The query string (where a create carries its id) is not part of the path.
                {"path": "supervisedFineTuningJobId=", "status": 500},
                {"method": "GET", "path": "/quotas/", "status": 503},
                {"path": "/sftq-abc$", "status": 409, "body": {"code": 10, "message": "aborted"}},
                {"path": "/sftq-abc$", "status": 418},
            ]
        },
    )
    assert _create(http, "sftq-abc").status_code == 200
    aborted = http.get(f"{BASE}/supervisedFineTuningJobs/sftq-abc")
    assert (aborted.status_code, aborted.json()) == (409, {"code": 10, "message": "aborted"})
    # Without `times`, a rule answers every time.
    assert http.delete(f"{BASE}/supervisedFineTuningJobs/sftq-abc").status_code == 409
    assert http.get(f"{BASE}/quotas/training-h200-count").status_code == 503
    assert http.get(f"{BASE}/quotas").status_code == 200  # "/quotas/" is not in this path
    # Without a body an error status gets the google-style body.
    http.post("/_sim/faults", json={"rules": [{"path": "/quotas", "status": 401}]})
    refused = http.get(f"{BASE}/quotas")
    assert refused.status_code == 401 and refused.json()["code"] == 16


def test_rules_sit_beside_the_other_fault_keys_and_an_empty_body_clears_all(
    http: httpx.Client, sim: Simulator
) -> None:
    both = {
        "error_rate": 1.0,
        "statuses": [503],
        "rules": [{"method": "GET", "path": "/dpoJobs/x$", "status": 404}],
    }
    assert http.post("/_sim/faults", json=both).status_code == 200
    assert http.get(f"{BASE}/dpoJobs/x").status_code == 404  # the rule, before any draw
    assert http.get(f"{BASE}/dpoJobs").status_code == 503  # the random fault
    assert http.post("/_sim/faults", json={}).json()["rules"] == []
    assert http.get(f"{BASE}/dpoJobs").status_code == 200
    sim.set_faults(rules=[{"path": "/dpoJobs", "status": 429}])
    limited = http.get(f"{BASE}/dpoJobs")
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "1"
    sim.reset()
    assert sim.faults()["rules"] == []


@pytest.mark.parametrize(
    "rules",
    [
        {"path": "x", "status": 403},  # not a list
        [{"status": 403}],  # no path
        [{"path": "(", "status": 403}],  # not a regex
        [{"path": "x", "status": 99}],
        [{"path": "x", "status": True}],
        [{"path": "x", "status": 403, "times": 0}],
        [{"path": "x", "status": 403, "method": "PO ST"}],
        [{"path": "x", "status": 403, "colour": "red"}],
        ["x"],
    ],
)
def test_bad_rules_are_400(http: httpx.Client, rules: object) -> None:
    response = http.post("/_sim/faults", json={"rules": rules})
    assert response.status_code == 400 and response.json()["code"] == 3
    assert http.get("/_sim/faults").json()["rules"] == []


def test_running_jobs_pass_through_pending_running_and_writing_results(
    http: httpx.Client, advance: Callable[[float], None]
) -> None:
    body = {**SFT, "epochs": 4}
    assert _create(http, "life", body).json()["state"] == "JOB_STATE_CREATING"
    seen: list[str] = []
    percents: list[int] = []
    for _ in range(61 * 4):
        job = http.get(f"{BASE}/supervisedFineTuningJobs/life").json()
        if not seen or seen[-1] != job["state"]:
            seen.append(job["state"])
        if "jobProgress" in job and job["state"] != "JOB_STATE_COMPLETED":
            percents.append(job["jobProgress"]["percent"])
            assert 1 <= job["jobProgress"]["epoch"] <= 4
        if job["state"] == "JOB_STATE_COMPLETED":
            assert job["jobProgress"] == {"percent": 100, "epoch": 4}
            break
        advance(0.25)
    assert tuple(seen) == LIFECYCLE
    assert percents == sorted(percents) and percents[0] < 5 and percents[-1] == 99
    assert job["estimatedCost"] == {"currencyCode": "USD", "units": "0", "nanos": 166666667}


def test_pending_comes_and_goes_within_the_first_second(
    http: httpx.Client, advance: Callable[[float], None]
) -> None:
    _create(http, "p")
    advance(0.5)
    pending = http.get(f"{BASE}/supervisedFineTuningJobs/p").json()
    assert pending["state"] == "JOB_STATE_PENDING" and "jobProgress" not in pending
    advance(0.5)
    running = http.get(f"{BASE}/supervisedFineTuningJobs/p").json()
    assert running["state"] == "JOB_STATE_RUNNING" and running["jobProgress"]["percent"] == 1
    advance(58.0)
    writing = http.get(f"{BASE}/supervisedFineTuningJobs/p").json()
    assert writing["state"] == "JOB_STATE_WRITING_RESULTS"
    assert writing["jobProgress"] == {"percent": 98, "epoch": 1}
