"""Per-user limits on the shared parts (issue 52): the request rate of POST /jobs, POST
/jobs:validate, retries and MCP tool calls (429 rate_limited with Retry-After and the IETF
RateLimit headers), the QUEUED jobs an operator may cap (429 queue_limit, race-free), and
what `sftq admin set-limits` / `list-users` show."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fn_support import SFT_PAYLOAD, Api, Db, assert_error
from werkzeug.test import Client

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.http.apps import make_jobs_api
from sftq_server.http.web import wsgi_app


def set_limits(db: Db, name: str | None, *, rpm: int | None = None,
               max_queued: int | None = None, max_streams: int | None = None,
               which: str = "") -> None:
    db.conn.execute("SELECT sftq.set_user_limits(%s, %s, %s, %s, %s, %s, %s)",
                    (name, rpm, max_queued, max_streams, "r" in which, "q" in which,
                     "s" in which))


def _body() -> str:
    return json.dumps({"kind": "SFT", "fireworks_payload": SFT_PAYLOAD})


def test_over_the_rate_is_429_with_retry_after_and_ratelimit_headers(api: Api, db: Db,
                                                                     alice: str, bob: str) -> None:
    set_limits(db, "alice", rpm=3, which="r")
    for _ in range(3):
        api.enqueue(alice)
    resp = api.submit(alice)
    body = assert_error(resp, 429, "rate_limited")
    assert "3 requests a minute" in body["error"]
    retry_after = int(resp.headers["Retry-After"])
    assert 1 <= retry_after <= 20  # one request frees every 20 s at 3 a minute
    assert resp.headers["RateLimit-Policy"] == '"default";q=3;w=60'
    m = re.fullmatch(r'"default";r=0;t=(\d+)', resp.headers["RateLimit"])
    assert m and retry_after <= int(m.group(1)) <= 60
    # Nothing was written for the refused request.
    assert db.one("SELECT count(*) FROM sftq.jobs j JOIN sftq.users u ON u.id = j.user_id "
                  "WHERE u.name = 'alice'") == 3
    # The limit is alice's: bob (the default, 600 a minute) is not touched by it.
    api.enqueue(bob)
    # validate counts against the same rate.
    resp = api.post("/jobs:validate", alice, data=_body(), content_type="application/json")
    assert_error(resp, 429, "rate_limited")
    ok = api.post("/jobs:validate", bob, data=_body(), content_type="application/json")
    assert ok.status_code == 200, ok.get_data(as_text=True)


def test_the_rate_refills_and_a_refused_request_costs_nothing(api: Api, db: Db,
                                                              alice: str) -> None:
    set_limits(db, "alice", rpm=60, which="r")
    # A minute's worth at once (the burst), then refused; an hour later the bucket is full
    # again (moved back in time rather than waited for).
    for _ in range(60):
        api.enqueue(alice)
    for _ in range(5):
        assert_error(api.submit(alice), 429, "rate_limited")
    db.conn.execute("UPDATE sftq.user_rate SET tat = tat - interval '1 hour'")
    for _ in range(60):
        api.enqueue(alice)
    assert_error(api.submit(alice), 429, "rate_limited")


def test_retry_counts_against_the_rate(api: Api, db: Db, alice: str) -> None:
    job = api.enqueue(alice)
    api.delete(f"/jobs/{job}", alice)
    set_limits(db, "alice", rpm=2, which="r")
    db.conn.execute("UPDATE sftq.user_rate SET tat = '-infinity'")  # a full bucket
    api.enqueue(alice)
    assert api.post(f"/jobs/{job}/retry", alice).status_code == 201
    assert_error(api.post(f"/jobs/{job}/retry", alice), 429, "rate_limited")


def test_rate_off_for_a_user_and_by_default(api: Api, db: Db, alice: str, bob: str) -> None:
    set_limits(db, None, rpm=2, which="r")  # the deployment's default
    set_limits(db, "alice", rpm=0, which="r")  # alice: no limit
    for _ in range(5):
        api.enqueue(alice)
    api.enqueue(bob)
    api.enqueue(bob)
    assert_error(api.submit(bob), 429, "rate_limited")
    set_limits(db, None, rpm=0, which="r")  # the operator's off switch
    api.enqueue(bob)


def test_the_queue_limit_refuses_with_429_naming_it(api: Api, db: Db, alice: str,
                                                    bob: str) -> None:
    set_limits(db, "alice", max_queued=2, which="q")
    a = api.enqueue(alice)
    api.enqueue(alice)
    body = assert_error(api.submit(alice), 429, "queue_limit")
    assert "at most 2 QUEUED jobs" in body["error"]
    assert "Retry-After" not in api.submit(alice).headers  # waiting alone does not help
    api.enqueue(bob)  # bob has no limit
    # A cancelled job frees its place.
    api.delete(f"/jobs/{a}", alice)
    api.enqueue(alice)


@pytest.fixture
def two_apps(settings: Settings) -> Iterator[list[Any]]:
    """Two jobs-api processes' worth: two pools, two group commits."""
    apps = [make_jobs_api(settings, db=Database(settings.database_url, max_size=4,
                                                timeout=5.0)) for _ in range(2)]
    try:
        yield apps
    finally:
        for app in apps:
            app.close()


def test_queue_limit_holds_under_concurrent_submits(two_apps: list[Any], db: Db,
                                                    alice: str) -> None:
    set_limits(db, "alice", max_queued=5, which="q")
    statuses: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def submit(i: int) -> None:
        client = Api(Client(wsgi_app(two_apps[i % 2])))
        start.wait()
        for _ in range(3):
            resp = client.submit(alice)
            with lock:
                statuses.append(resp.status_code)
            if resp.status_code != 201:
                assert_error(resp, 429, "queue_limit")

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses.count(201) == 5, statuses
    assert db.one("SELECT count(*) FROM sftq.jobs WHERE state = 'QUEUED'") == 5
    assert db.one("SELECT queued_count FROM sftq.users WHERE name = 'alice'") == 5


def test_two_transactions_at_the_limit_cannot_both_enqueue(db_url: str, db: Db,
                                                           alice: str) -> None:
    """The race the recheck closes: both pass the check against the same count. The rate is
    off, so nothing else serialises them."""
    set_limits(db, "alice", rpm=0, max_queued=1, which="rq")
    key_hash = hashlib.sha256(alice.encode()).digest()
    sql = ("SELECT err_state FROM sftq.api_submit_many(ARRAY[%s]::bytea[], ARRAY['SFT'], "
           "ARRAY['{}'::jsonb], ARRAY[NULL::text], ARRAY[4], ARRAY[NULL::text], "
           "ARRAY[NULL::int], NULL)")
    # Touched once now: the key's last_used_at then needs no write (no lock) in either.
    db.conn.execute("SELECT sftq.authenticate(%s)", (key_hash,))
    first = psycopg.connect(db_url)
    second = psycopg.connect(db_url, autocommit=True)
    try:
        assert first.execute(sql, (key_hash,)).fetchone() == (None,)  # not committed yet
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append(second.execute(sql, (key_hash,)).fetchone())
            except psycopg.Error as exc:
                outcome.append(exc.sqlstate)

        t = threading.Thread(target=run)
        t.start()
        t.join(0.5)
        assert t.is_alive()  # waiting for alice's row
        first.commit()
        t.join(5)
        assert outcome == ["SQ4QL"]  # raised by the recheck: the group commit retries alone
    finally:
        first.close()
        second.close()
    assert db.one("SELECT queued_count FROM sftq.users WHERE name = 'alice'") == 1


# -- MCP: tool calls count against the rate; a wait holds a stream slot -----------------------

def _mcp_call(client: Client, key: str, name: str, arguments: dict[str, Any],
              id_: int = 1) -> dict[str, Any]:
    resp = client.post("/functions/v1/mcp", data=json.dumps({
        "jsonrpc": "2.0", "id": id_, "method": "tools/call",
        "params": {"name": name, "arguments": arguments}}), headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream"})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    text = resp.get_data(as_text=True)
    if text.startswith("event:") or text.startswith("data:"):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:"))
    message = json.loads(text)
    assert message["id"] == id_
    result: dict[str, Any] = message["result"]
    return result


def _tool_error(result: dict[str, Any]) -> dict[str, Any]:
    assert result.get("isError") is True, result
    error: dict[str, Any] = json.loads(result["content"][0]["text"])["error"]
    return error


def test_mcp_tool_calls_are_rate_limited_as_tool_errors(gateway: Any, db: Db, alice: str,
                                                        bob: str) -> None:
    set_limits(db, "alice", rpm=2, which="r")
    client = Client(gateway)
    for i in range(2):
        assert not _mcp_call(client, alice, "list_jobs", {}, i).get("isError")
    error = _tool_error(_mcp_call(client, alice, "list_jobs", {}, 9))
    assert error["code"] == "rate_limited" and error["status"] == 429
    assert error["details"]["limit"] == 2 and error["details"]["retry_after"] >= 1
    assert not _mcp_call(client, bob, "list_jobs", {}).get("isError")


def test_an_mcp_wait_holds_a_stream_slot_while_it_waits(gateway: Any, api: Api, db: Db,
                                                        alice: str) -> None:
    set_limits(db, "alice", max_streams=1, which="s")
    job = api.enqueue(alice)
    results: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: results.append(_mcp_call(
        Client(gateway), alice, "wait_for_job", {"job_id": job, "timeout_seconds": 3}, 1)))
    waiter.start()
    try:
        deadline = time.monotonic() + 10
        while not db.one("SELECT count(*) FROM sftq.user_leases WHERE kind = 'wait'"):
            assert time.monotonic() < deadline, "the wait took no slot"
            time.sleep(0.05)
        error = _tool_error(_mcp_call(Client(gateway), alice, "wait_for_job",
                                      {"job_id": job, "timeout_seconds": 1}, 2))
        assert error["code"] == "too_many_streams" and error["status"] == 429
    finally:
        waiter.join(15)
    assert results and results[0]["structuredContent"]["timed_out"] is True
    # The wait is over: its slot is freed (right after its answer went out).
    deadline = time.monotonic() + 10
    while db.one("SELECT count(*) FROM sftq.user_leases"):
        assert time.monotonic() < deadline, "the wait kept its slot"
        time.sleep(0.05)


# -- the operator's side: sftq admin set-limits / list-users --------------------------------

def _sftq_admin(db_url: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str,
                                                                                     str]:
    from sftq_server.cli import main

    code = main(["admin", *args, "--database-url", db_url])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_set_limits_and_list_users_through_the_cli(db_url: str, db: Db, alice: str, bob: str,
                                                   capsys: pytest.CaptureFixture[str],
                                                   api: Api) -> None:
    code, out, _ = _sftq_admin(db_url, capsys, "set-limits", "alice", "--rpm", "120",
                               "--max-queued", "5")
    assert code == 0
    assert out.strip() == ("alice: 120 requests a minute, 5 queued jobs at most, "
                           "10 streams and waits at once (default)")
    code, out, _ = _sftq_admin(db_url, capsys, "list-users", "--json")
    users = {u["name"]: u for u in json.loads(out)}
    assert (users["alice"]["rate_per_minute"], users["alice"]["max_queued"],
            users["alice"]["max_streams"]) == (120, 5, 10)
    assert users["alice"]["own_limits"] == ["rate_per_minute", "max_queued"]
    assert (users["bob"]["rate_per_minute"], users["bob"]["max_queued"],
            users["bob"]["own_limits"]) == (600, 0, [])
    # The defaults move every user without a limit of their own.
    code, out, _ = _sftq_admin(db_url, capsys, "set-limits", "--default", "--max-streams", "3")
    assert code == 0 and out.startswith("the default: 600 requests a minute")
    code, out, _ = _sftq_admin(db_url, capsys, "list-users")
    lines = out.splitlines()
    assert lines[0].split()[-4:] == ["RPM", "MAX", "QUEUED", "STREAMS"]
    alice_row = next(line.split() for line in lines if line.startswith("alice"))
    bob_row = next(line.split() for line in lines if line.startswith("bob"))
    assert alice_row[-3:] == ["120*", "5*", "0/3"] and bob_row[-3:] == ["600", "-", "0/3"]
    # It takes effect at the next request.
    set_limits(db, "alice", max_queued=1, which="q")
    api.enqueue(alice)
    assert_error(api.submit(alice), 429, "queue_limit")
    code, out, _ = _sftq_admin(db_url, capsys, "set-limits", "alice", "--max-queued", "default")
    assert code == 0 and "no queue limit (default)" in out
    api.enqueue(alice)
    # Mistakes say what to fix, with the admin exit codes.
    assert _sftq_admin(db_url, capsys, "set-limits", "nobody", "--rpm", "1")[0] == 4
    code, _, err = _sftq_admin(db_url, capsys, "set-limits", "alice", "--rpm", "lots")
    assert code == 7 and "whole number" in err
    assert _sftq_admin(db_url, capsys, "set-limits", "alice")[0] == 7
    assert _sftq_admin(db_url, capsys, "set-limits", "--rpm", "5")[0] == 2
