"""The stream over real HTTP with a real SSE client (httpx-sse)."""

from __future__ import annotations

import time
from dataclasses import replace

import httpx
from conftest import FAST, AsgiServer, GatewayServer
from stream_support import Reader, Sql, data, headers

from sftq_server.core.settings import Settings


def test_job_stream_frames_in_order_then_end(asgi, sql: Sql) -> None:
    key = sql.user("alice")
    job = sql.enqueue("alice")
    r = Reader(f"{asgi.url}/jobs/{job}/stream", key)
    first = r.wait_events(1)[0]
    assert r.status == 200 and r.content_type == "text/event-stream"
    assert first.event == "status" and data(first)["state"] == "QUEUED" and first.id
    sql.admit()
    sql.submitted(job)
    sql.provider(job, "JOB_STATE_RUNNING")
    sql.provider(job, "JOB_STATE_COMPLETED")
    events = r.wait_for(lambda evs: any(e.event == "end" for e in evs))
    r.join()
    kinds = [(e.event, data(e).get("state")) for e in events]
    assert kinds == [("status", "QUEUED"), ("status", "PROGRESS"), ("progress", None),
                     ("status", "SUCCESS"), ("end", None)], kinds
    assert data(events[1])["completed_at"] is None and data(events[1])["started_at"]
    assert data(events[2])["provider_state"] == "JOB_STATE_RUNNING"
    ids = [e.id for e in events[:-1]]
    assert all(ids) and ids == sorted(ids, key=int) and len(set(ids)) == len(ids)
    assert events[-1].id == events[-2].id


def _raw_lines(url: str, key: str, seconds: float) -> list[str]:
    """The raw lines of a stream for a while (httpx-sse drops comments; heartbeats are ones)."""
    lines: list[str] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=10) as client, client.stream(
            "GET", url, headers=headers(key)) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if time.monotonic() > deadline:
                break
    return lines


def test_idle_stream_sends_heartbeats_without_ids(asgi, sql: Sql) -> None:
    key = sql.user("alice")
    lines = _raw_lines(f"{asgi.url}/jobs/stream", key, 1.8)
    pings = [ln for ln in lines if ln == ": ping"]
    assert len(pings) >= 2, lines
    assert not any(ln.startswith("id:") for ln in lines), lines  # nothing happened: no frame


def test_all_jobs_stream_snapshot_then_new_jobs_and_never_closes(asgi, sql: Sql) -> None:
    key = sql.user("alice")
    sql.user("bob")
    done = sql.enqueue("alice")
    sql.admit()
    sql.provider(done, "JOB_STATE_FAILED")
    queued = sql.enqueue("alice")
    sql.enqueue("bob")
    with Reader(f"{asgi.url}/jobs/stream", key) as r:
        first = r.wait_events(1)
        assert [(e.event, data(e)["id"], data(e)["state"]) for e in first] == [
            ("status", queued, "QUEUED")]
        new = sql.enqueue("alice")
        sql.enqueue("bob")  # not hers: never shown
        sql.cancel("alice", queued)
        events = r.wait_events(3)
        assert [(e.event, data(e)["id"], data(e)["state"]) for e in events[1:]] == [
            ("status", new, "QUEUED"), ("status", queued, "CANCELLED")]
        time.sleep(0.6)
        assert r.closed_by_server is False and r.error is None


def test_resume_after_a_drop_misses_nothing_and_repeats_nothing(asgi, sql: Sql) -> None:
    key = sql.user("alice")
    jobs = [sql.enqueue("alice") for _ in range(3)]
    first = Reader(f"{asgi.url}/jobs/stream", key, stop_after=2)
    seen = first.wait_events(2)
    first.join()
    # While the client is away: a cancel, an admission, a new job.
    sql.cancel("alice", jobs[0])
    sql.admit()
    extra = sql.enqueue("alice")
    with Reader(f"{asgi.url}/jobs/stream", key, last_event_id=seen[-1].id) as second:
        rest = second.wait_events(4)
        time.sleep(0.5)
        rest = list(second.events)
    everything = seen + rest
    ids = [e.id for e in everything]
    assert len(ids) == len(set(ids)), ids
    got = [(data(e)["id"], data(e)["state"]) for e in everything]
    assert got == [(jobs[0], "QUEUED"), (jobs[1], "QUEUED"), (jobs[2], "QUEUED"),
                   (jobs[0], "CANCELLED"), (jobs[1], "PROGRESS"), (extra, "QUEUED")], got


def test_job_stream_resumes_after_its_terminal_frame_with_only_end(asgi, sql: Sql) -> None:
    key = sql.user("alice")
    job = sql.enqueue("alice")
    sql.cancel("alice", job)
    with Reader(f"{asgi.url}/jobs/{job}/stream", key) as r:
        events = r.wait_for(lambda evs: evs and evs[-1].event == "end")
        assert [e.event for e in events] == ["status", "end"]
        assert data(events[0])["state"] == "CANCELLED"
    with Reader(f"{asgi.url}/jobs/{job}/stream", key, last_event_id=events[0].id) as again:
        assert [e.event for e in again.wait_for(lambda evs: evs and evs[-1].event == "end")] \
            == ["end"]


def test_errors_are_the_json_envelope(asgi, sql: Sql) -> None:
    alice = sql.user("alice")
    bob = sql.user("bob")
    job = sql.enqueue("alice")
    bobs = sql.enqueue("bob")
    with httpx.Client(timeout=10) as client:
        def get(path: str, key: str | None, last: str | None = None) -> httpx.Response:
            return client.get(asgi.url + path, headers=headers(key, last))

        for resp, status, code in [
            (get(f"/jobs/{job}/stream", None), 401, "unauthorized"),
            (get("/jobs/stream", "sftq_" + "0" * 48), 401, "unauthorized"),
            (get(f"/jobs/{job}/stream", bob), 404, "not_found"),
            (get("/jobs/not-a-uuid/stream", alice), 404, "not_found"),
            (get("/jobs/stream", alice, "bogus"), 400, "validation_error"),
            (get("/jobs/stream", alice, "999999999"), 400, "validation_error"),
        ]:
            assert resp.status_code == status, (resp.status_code, resp.text)
            assert resp.headers["content-type"] == "application/json"
            body = resp.json()
            assert body["code"] == code and isinstance(body["error"], str), body
            assert set(body) <= {"error", "code", "details"}
        # Bob's event id is foreign to Alice: the same 400 as an unknown one.
        with Reader(f"{asgi.url}/jobs/{bobs}/stream", bob) as r:
            bob_id = r.wait_events(1)[0].id
        resp = get(f"/jobs/{job}/stream", alice, bob_id)
        assert resp.status_code == 400 and resp.json()["code"] == "validation_error"


def test_max_duration_sends_reconnect_with_the_last_id(db_url: str, sql: Sql) -> None:
    server = AsgiServer(db_url, replace(FAST, max_seconds=1.0))
    try:
        key = sql.user("alice")
        job = sql.enqueue("alice")
        with Reader(f"{server.url}/jobs/{job}/stream", key) as r:
            events = r.wait_for(lambda evs: evs and evs[-1].event == "reconnect", timeout=10)
            r.join()
        assert [e.event for e in events] == ["status", "reconnect"]
        assert events[1].id == events[0].id
    finally:
        server.stop()


def test_one_poll_serves_every_open_stream(asgi, sql: Sql) -> None:
    keys = [sql.user(f"u{i}") for i in range(5)]
    jobs = [sql.enqueue(f"u{i}") for i in range(5)]
    readers = [Reader(f"{asgi.url}/jobs/{job}/stream", key) for job, key in zip(jobs, keys,
                                                                              strict=True)
               for _ in range(4)]
    try:
        for r in readers:
            r.wait_events(1)
        hub = asgi.hub
        deadline = time.monotonic() + 5
        while hub.unsynced and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not hub.unsynced and hub.open_streams == 20
        q0, p0 = hub.queries, hub.polls
        time.sleep(1.0)
        # 20 streams, a poll every 100 ms: about ten polls, each one query, for all of them.
        assert 5 <= hub.polls - p0 <= 12
        assert hub.queries - q0 == hub.polls - p0
        sql.admit()
        for r in readers:
            r.wait_events(2)
    finally:
        for r in readers:
            r.stop()


def test_the_gateway_serves_the_stream_at_the_same_paths(gateway, sql: Sql) -> None:
    key = sql.user("alice")
    job = sql.enqueue("alice")
    with Reader(f"{gateway.url}/jobs/{job}/stream", key) as r:
        assert r.wait_events(1)[0].event == "status"
        assert r.content_type == "text/event-stream"
        sql.admit()
        sql.provider(job, "JOB_STATE_COMPLETED")
        events = r.wait_for(lambda evs: evs[-1].event == "end")
    assert [data(e).get("state") for e in events] == ["QUEUED", "PROGRESS", "SUCCESS", None]
    lines = _raw_lines(f"{gateway.url}/jobs/stream", key, 1.2)
    assert ": ping" in lines
    with httpx.Client(timeout=10) as client:
        resp = client.get(f"{gateway.url}/jobs/{job}/stream")
        assert resp.status_code == 401 and resp.json()["code"] == "unauthorized"
        # The other routes are the WSGI jobs-api as before.
        assert client.get(f"{gateway.url}/jobs/{job}", headers=headers(key)).json()["id"] == job


def test_wsgi_only_jobs_api_answers_501_on_the_stream_paths(settings, sql: Sql) -> None:
    from werkzeug.test import Client

    from sftq_server.http.apps import make_jobs_api
    from sftq_server.http.web import wsgi_app

    key = sql.user("alice")
    job = sql.enqueue("alice")
    app = make_jobs_api(settings)
    try:
        client = Client(wsgi_app(app))
        for path in ("/jobs/stream", f"/jobs/{job}/stream"):
            resp = client.get(path, headers=headers(key))
            assert resp.status_code == 501 and resp.json["code"] == "stream_unavailable"
    finally:
        app.close()


def test_a_quiet_stream_is_answered_at_once(settings: Settings, sql: Sql) -> None:
    """With nothing to say and the next heartbeat far away, the reader still hears at once
    that it is connected (the gateway sends headers only with the first body bytes)."""
    key = sql.user("alice")
    gateway = GatewayServer(replace(settings, stream=replace(FAST, heartbeat_seconds=30.0)))
    try:
        started = time.monotonic()
        with httpx.Client(timeout=10) as client, client.stream(
                "GET", f"{gateway.url}/jobs/stream", headers=headers(key)) as response:
            assert response.status_code == 200
            first = next(response.iter_lines())
    finally:
        gateway.stop()
    assert first == ": connected"
    assert time.monotonic() - started < 5
