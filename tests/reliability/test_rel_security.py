"""Security through the served stack: another user's job is a 404 indistinguishable from a
job that does not exist (get, cancel, analytics, in every state); revoked, disabled, unknown
and malformed keys are 401; how long a key lookup takes does not depend on how much of the
key matches; the tick endpoint refuses a missing or wrong secret; analysts and API callers
never see key material or payload secrets; and no secret reaches any log.

Single cases of these live in tests/functions (test_http_jobs.py: 404 not 403, revoked keys;
test_http_cancel.py, test_http_analytics.py), tests/sql/test_analyst_role.py (the analyst's
grants) and tests/scheduler/test_sched_faults.py (the Fireworks key in the tick's output).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from rel_probes import (
    analyst_problems,
    bad_key_problems,
    build_world,
    capture_every_logger,
    cross_user_problems,
    leaks,
    log_scenario,
    measure_key_lookup,
    tick_secret_problems,
)
from rel_support import (
    TICK_SECRET,
    connect,
    env_int,
    make_users,
    rel_settings,
)
from werkzeug.test import Client

from sftq_server.db import Database
from sftq_server.http.apps import make_jobs_api
from sftq_server.http.web import wsgi_app


def test_other_users_jobs_are_404_in_every_state(db_url: str, make_sim: Any, make_gateway: Any,
                                                 figures: dict[str, Any]) -> None:
    world = build_world(db_url, make_sim, make_gateway)
    problems, probes = cross_user_problems(world)
    figures["probes"] = probes
    assert probes == 3 * 2 * 5 * 4  # viewers x other users x states x routes
    assert not problems, problems[:10]


def test_revoked_disabled_unknown_and_malformed_keys_are_401(
        db_url: str, make_sim: Any, make_gateway: Any, figures: dict[str, Any]) -> None:
    world = build_world(db_url, make_sim, make_gateway, faults=False)
    problems, probes = bad_key_problems(world)
    figures["probes"] = probes
    assert probes >= 90
    assert not problems, problems[:10]


def test_key_lookup_time_does_not_depend_on_how_much_of_the_key_matches(
        db_url: str, figures: dict[str, Any]) -> None:
    with connect(db_url) as conn:
        (user,) = make_users(conn, 1)
    db = Database(db_url, max_size=1, timeout=5.0)
    app = make_jobs_api(rel_settings(db_url, "http://127.0.0.1:9"), db=db)
    try:
        timing = measure_key_lookup(Client(wsgi_app(app)), user.keys[0],
                                    env_int("SFTQ_REL_TIMING_ROUNDS", 1000))
    finally:
        app.close()
    figures.update(vars(timing))
    assert not timing.leaks, vars(timing)
    # The control pair (two keys sharing nothing) sits within the same limit: the limit is
    # about noise, not about a systematic difference between any two keys.
    assert abs(timing.control_us) <= timing.limit_us, vars(timing)


def test_the_tick_endpoint_refuses_a_missing_or_wrong_secret(
        db_url: str, make_sim: Any, make_gateway: Any, figures: dict[str, Any]) -> None:
    world = build_world(db_url, make_sim, make_gateway, faults=False)
    problems, probes = tick_secret_problems(world)
    # Without a configured secret the endpoint refuses to run ticks at all.
    open_gateway = make_gateway(rel_settings(db_url, "http://127.0.0.1:9", tick_secret=""))
    for auth in ({}, {"Authorization": "Bearer"}, {"Authorization": f"Bearer {TICK_SECRET}"}):
        resp = httpx.post(open_gateway.tick_url, headers=auth, timeout=10)
        probes += 1
        if resp.status_code != 503 or resp.json().get("code") != "not_configured":
            problems.append(f"no secret configured, {auth}: {resp.status_code}")
    figures["probes"] = probes
    assert not problems, problems


def test_analysts_and_api_callers_never_see_key_material_or_payload_secrets(
        db_url: str, make_sim: Any, make_gateway: Any, figures: dict[str, Any]) -> None:
    world = build_world(db_url, make_sim, make_gateway)
    cross_user_problems(world)  # more answers to search, errors among them
    problems, rows = analyst_problems(world)
    figures.update({"analyst_rows_read": rows, "api_answers_searched": len(world.bodies)})
    assert rows >= 15 * 2
    assert not problems, problems


def test_secrets_never_reach_the_logs(db_url: str, make_sim: Any, make_gateway: Any,
                                      tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                      figures: dict[str, Any]) -> None:
    capture_every_logger(caplog)
    outputs, secrets = log_scenario(db_url, make_sim, make_gateway, tmp_path)
    records = caplog.records
    texts = {"captured log records": caplog.text,
             "log record attributes": "\n".join(repr(vars(r)) for r in records), **outputs}
    by_logger = sorted({r.name for r in records})
    figures.update({"records": len(records), "loggers": len(by_logger),
                    "child_output_chars": {k: len(v) for k, v in outputs.items()},
                    "secrets_searched": len(secrets)})
    # The run really logged: access lines, scheduler warnings, provider debug lines, children.
    assert len(records) >= 100, by_logger
    for name in ("sftq.access", "sftq_server.scheduler.tick", "sftq_server.provider"):
        assert name in by_logger, by_logger
    assert "tick" in outputs["sftq tick -v #0"] and "jobs-api" in outputs["served gateway"]
    found = leaks(texts, secrets)
    assert not found, found[:10]
