"""GET /capacity: the quota as last read, what runs and waits, per user, and the scheduler's
health. Every figure is checked against counts taken in SQL, with SFTQ_CAPACITY_SHOW_USERS
both ways."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fn_support import Api, Db, assert_error
from test_http_openapi import Conformance
from werkzeug.test import Client

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.http.apps import ApiApp, make_jobs_api
from sftq_server.http.models import Capacity
from sftq_server.http.web import wsgi_app

PER_USER_SQL = """
SELECT u.name, u.max_running,
       count(*) FILTER (WHERE j.state = 'PROGRESS'),
       COALESCE(sum(j.gpu_count) FILTER (WHERE j.state = 'PROGRESS'), 0),
       count(*) FILTER (WHERE j.state = 'QUEUED'),
       COALESCE(sum(j.gpu_count) FILTER (WHERE j.state = 'QUEUED'), 0)
  FROM sftq.jobs j JOIN sftq.users u ON u.id = j.user_id
 WHERE j.state IN ('QUEUED', 'PROGRESS')
 GROUP BY u.name, u.max_running
"""


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


def tick(db: Db, seconds_ago: float, limit: int | None, usage: float = 0,
         quota: dict[str, Any] | None = None) -> None:
    at = db.one("SELECT now() - make_interval(secs => %s)", seconds_ago)
    tick_id = db.one("SELECT sftq.tick_begin('test', interval '2 minutes', %s)", at)
    result: dict[str, Any] = {}
    if limit is not None:
        result = {"quota_limit": limit, "quota_usage": usage}
    if quota is not None:
        result["quota"] = quota
    db.one("SELECT sftq.tick_finish(%s, %s::jsonb, %s)", tick_id, json.dumps(result), at)


@pytest.fixture
def busy(api: Api, db: Db) -> dict[str, str]:
    """Four users with different work: running, queued, both, none."""
    keys = {name: db.user(name) for name in ("ann", "ben", "cat", "dan")}
    for name, gpus in (("ann", 8), ("ben", 2), ("cat", 4)):
        api.enqueue(keys[name], gpu_count=gpus)
    db.admit(64)
    api.enqueue(keys["ann"], gpu_count=4)
    api.enqueue(keys["ann"], gpu_count=16)
    api.enqueue(keys["ben"], gpu_count=1)
    db.conn.execute("SELECT sftq.set_cap('ben', 3)")
    tick(db, 5, limit=32, usage=10.5, quota={"name": "training-h200-count", "limit": 32})
    return keys


def sql_figures(db: Db) -> dict[str, tuple[Any, ...]]:
    return {r[0]: tuple(r[1:]) for r in db.conn.execute(PER_USER_SQL).fetchall()}


def test_figures_match_sql_with_every_user_shown(make_api: Any, db: Db,
                                                 busy: dict[str, str]) -> None:
    body = make_api().get("/capacity", busy["dan"]).json
    Capacity.model_validate(body)
    sql = sql_figures(db)
    users = {u["name"]: (u["cap"], u["running_jobs"], u["running_gpus"], u["queued_jobs"],
                         u["queued_gpus"]) for u in body["users"]}
    assert users == sql
    # Only users with work (dan has none), most running GPUs first.
    assert [u["name"] for u in body["users"]] == ["ann", "cat", "ben"]
    totals = db.conn.execute(
        "SELECT count(*) FILTER (WHERE state = 'PROGRESS'),"
        " COALESCE(sum(gpu_count) FILTER (WHERE state = 'PROGRESS'), 0),"
        " count(*) FILTER (WHERE state = 'QUEUED'),"
        " COALESCE(sum(gpu_count) FILTER (WHERE state = 'QUEUED'), 0) FROM sftq.jobs").fetchone()
    assert (body["running"]["jobs"], body["running"]["gpus"], body["queued"]["jobs"],
            body["queued"]["gpus"]) == totals
    assert body["quota"]["id"] == "training-h200-count"
    assert (body["quota"]["limit"], body["quota"]["usage"]) == (32, 10.5)
    assert body["quota"]["read_at"].endswith("Z")
    # free_gpus is what admission would spend with that reading (sftq.admission_budget).
    budget = db.one("SELECT budget FROM sftq.admission_budget(32, 10.5, interval '300 s', now())")
    assert body["free_gpus"] == max(budget, 0)
    assert body["scheduler"]["healthy"] is True
    assert body["scheduler"]["interval_seconds"] == 30
    assert body["scheduler"]["last_tick_at"] == body["quota"]["read_at"]


def test_other_users_folded_into_others(make_api: Any, db: Db, busy: dict[str, str]) -> None:
    hidden = make_api(capacity_show_users=False)
    sql = sql_figures(db)
    body = hidden.get("/capacity", busy["ben"]).json
    Capacity.model_validate(body)
    rows = {u["name"]: u for u in body["users"]}
    assert set(rows) == {"ben", "others"}
    ben = rows["ben"]
    assert (ben["cap"], ben["running_jobs"], ben["running_gpus"], ben["queued_jobs"],
            ben["queued_gpus"]) == sql["ben"]
    others = rows["others"]
    assert others["cap"] is None
    for i, field in enumerate(("running_jobs", "running_gpus", "queued_jobs", "queued_gpus"),
                              start=1):
        assert others[field] == sum(v[i] for k, v in sql.items() if k != "ben")
    text = json.dumps(body)
    assert "ann" not in text and "cat" not in text
    # Someone with no work sees only the others row; the totals do not change.
    dan = hidden.get("/capacity", busy["dan"]).json
    assert [u["name"] for u in dan["users"]] == ["others"]
    assert dan["running"] == body["running"] and dan["queued"] == body["queued"]


def test_before_any_tick_and_when_the_scheduler_stalls(make_api: Any, db: Db,
                                                       alice: str) -> None:
    api = make_api()
    body = api.get("/capacity", alice).json
    assert body["quota"] == {"id": "training-h200-count", "limit": None, "usage": None,
                             "read_at": None}
    assert body["free_gpus"] is None and body["users"] == []
    assert body["scheduler"] == {"last_tick_at": None, "interval_seconds": 30, "healthy": False}
    tick(db, 100, limit=8)
    assert api.get("/capacity", alice).json["scheduler"]["healthy"] is False
    assert make_api(tick_interval_seconds=60.0).get(
        "/capacity", alice).json["scheduler"]["healthy"] is True
    # Ticks that cannot read the quota keep the last reading, and are not healthy for long.
    tick(db, 0, limit=None)
    body = api.get("/capacity", alice).json
    assert body["quota"]["limit"] == 8 and body["scheduler"]["healthy"] is False


def test_key_and_parameters(api: Api, alice: str) -> None:
    assert_error(api.get("/capacity"), 401, "unauthorized")
    assert_error(api.get("/capacity?users=all", alice), 400, "validation_error")
    resp = api.get("/capacity", alice)
    assert resp.status_code == 200 and resp.headers["Cache-Control"] == "no-store"
    conformance = Conformance()
    for r in (resp, api.get("/capacity"), api.get("/capacity?x=1", alice)):
        conformance.check(r, "GET", "/capacity")
    assert {s for _, _, s in conformance.seen} == {200, 400, 401}
