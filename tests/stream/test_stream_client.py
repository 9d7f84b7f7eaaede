"""The client (sync and async), `sftq wait`, `sftq watch` and `events --follow` on the stream."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from conftest import FAST, AsgiServer
from stream_support import Sql

from sftq_client import (
    AsyncClient,
    Client,
    EndEvent,
    ProgressEvent,
    QueueEvent,
    StatusEvent,
    StreamUnavailable,
)
from sftq_client.cli import main


def _later(delay: float, *steps: Any) -> threading.Thread:
    def run() -> None:
        for step in steps:
            time.sleep(delay)
            step()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_client_stream_yields_typed_events_until_end(asgi, sql: Sql) -> None:
    key = sql.user("alice")
    job = sql.enqueue("alice")
    _later(0.3, sql.admit, lambda: sql.provider(job, "JOB_STATE_RUNNING"),
           lambda: sql.provider(job, "JOB_STATE_COMPLETED"))
    with Client(api_key=key, base_url=asgi.url) as client:
        events = list(client.stream(job))
    assert [type(e) for e in events] == [StatusEvent, StatusEvent, ProgressEvent, StatusEvent,
                                         EndEvent]
    assert [e.job.state for e in events if isinstance(e, StatusEvent)] == [
        "QUEUED", "PROGRESS", "SUCCESS"]
    assert isinstance(events[2], ProgressEvent) and events[2].provider_state == "JOB_STATE_RUNNING"


def test_client_resumes_across_server_reconnects_without_gaps(db_url: str, sql: Sql) -> None:
    server = AsgiServer(db_url, replace(FAST, max_seconds=0.7))
    try:
        key = sql.user("alice")
        jobs = [sql.enqueue("alice") for _ in range(3)]
        steps = [lambda j=j: sql.cancel("alice", j) for j in jobs]
        _later(0.5, *steps)
        seen: list[StatusEvent] = []
        with Client(api_key=key, base_url=server.url) as client:
            for event in client.stream():
                assert isinstance(event, StatusEvent)
                seen.append(event)
                if len(seen) == 6:
                    break
        ids = [e.id for e in seen]
        assert len(set(ids)) == 6
        assert sorted((e.job.id, e.job.state) for e in seen) == sorted(
            [(j, "QUEUED") for j in jobs] + [(j, "CANCELLED") for j in jobs])
        assert sum(h.open_streams for h in server.hubs) <= 1
    finally:
        server.stop()


def test_async_client_stream(asgi, sql: Sql) -> None:
    key = sql.user("alice")
    job = sql.enqueue("alice")

    async def go() -> list[Any]:
        async with AsyncClient(api_key=key, base_url=asgi.url) as client:
            got = []
            _later(0.3, lambda: sql.cancel("alice", job))
            async for event in client.stream(job):
                got.append(event)
            return got

    events = asyncio.run(go())
    assert [type(e) for e in events] == [StatusEvent, StatusEvent, EndEvent]
    assert events[1].job.state == "CANCELLED"


def test_queue_events_reach_the_client(asgi, sql: Sql) -> None:
    key = sql.user("alice")
    sql.user("bob")
    sql.enqueue("bob")
    job = sql.enqueue("alice", gpus=8)
    _later(0.5, sql.tick)
    with Client(api_key=key, base_url=asgi.url) as client:
        for event in client.stream(job):
            if isinstance(event, QueueEvent):
                assert event.job_id == job and event.queue_position == 1
                break


def _cli(monkeypatch: pytest.MonkeyPatch, url: str, key: str) -> None:
    monkeypatch.setenv("SFTQ_API_URL", url)
    monkeypatch.setenv("SFTQ_API_KEY", key)


def test_cli_wait_follows_the_stream(asgi, sql: Sql, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    key = sql.user("alice")
    job = sql.enqueue("alice")
    _cli(monkeypatch, asgi.url, key)
    _later(0.3, sql.admit, lambda: sql.provider(job, "JOB_STATE_FAILED"))
    started = time.monotonic()
    assert main(["wait", job]) == 10  # the job ended FAIL
    assert time.monotonic() - started < 5  # within about a poll of each change, not 5 s polls
    out, errs = capsys.readouterr()
    assert "state:" in out and "FAIL" in out
    lines = [ln.split(" ", 1)[1] for ln in errs.splitlines()]
    assert lines == [f"{job} QUEUED", f"{job} PROGRESS", f"{job} FAIL"], errs


def test_cli_wait_polls_where_the_server_does_not_stream(settings, sql: Sql,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from werkzeug.serving import make_server

    from sftq_server.http.apps import make_jobs_api
    from sftq_server.http.web import wsgi_app

    key = sql.user("alice")
    job = sql.enqueue("alice")
    sql.cancel("alice", job)
    app = make_jobs_api(settings)
    server = make_server("127.0.0.1", 0, wsgi_app(app), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        with Client(api_key=key, base_url=url) as client, pytest.raises(StreamUnavailable):
            next(iter(client.stream(job)))
        _cli(monkeypatch, url, key)
        assert main(["wait", job, "--interval", "0.2"]) == 11  # CANCELLED, by polling
    finally:
        server.shutdown()
        server.server_close()
        app.close()


def test_cli_watch_updates_live(asgi, sql: Sql, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    key = sql.user("alice")
    first = sql.enqueue("alice")
    _cli(monkeypatch, asgi.url, key)
    holder: dict[str, str] = {}
    _later(0.4, lambda: holder.setdefault("second", sql.enqueue("alice")), sql.admit,
           lambda: sql.cancel("alice", holder["second"]))
    assert main(["watch", "--timeout", "2.5"]) == 0
    lines = [ln.split(" ", 1)[1] for ln in capsys.readouterr().out.splitlines()]
    assert lines == [f"{first} QUEUED", f"{holder['second']} QUEUED", f"{first} PROGRESS",
                     f"{holder['second']} CANCELLED"], lines


def test_follow_events_prints_until_the_job_ends(settings, sql: Sql,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from sftq_client.cli._common import Context
    from sftq_client.cli.watch import follow_events
    from sftq_server.http.gateway import make_server

    key = sql.user("alice")
    job = sql.enqueue("alice")
    # The whole gateway (jobs-api and the stream), as `sftq dev` serves it: --follow reads the
    # job's events, woken by the stream.
    server = make_server("127.0.0.1", 0, settings)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.port}/functions/v1/jobs-api"
    try:
        _later(0.5, lambda: sql.cancel("alice", job))
        ctx = Context(argparse.Namespace(api_key=key, api_url=url),
                      lambda k, u: Client(api_key=k, base_url=u))
        started = time.monotonic()
        try:
            assert follow_events(ctx, job, as_json=True) == 0
        finally:
            ctx.close()
        assert time.monotonic() - started < 5  # woken by the stream, not a 5 s poll
        # The job's events as `sftq events --json` gives them, one per line (issue 54.16).
        events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(e["type"], e["state"]) for e in events] == [("queued", "QUEUED"),
                                                             ("cancelled", "CANCELLED")], events
        assert all(e["job_id"] == job and e["message"] for e in events)
        # Rows like `sftq events` prints them, once the job has ended too.
        _cli(monkeypatch, url, key)
        assert main(["events", job, "--follow"]) == 0
        rows = capsys.readouterr().out.splitlines()
        assert rows[0].split() == ["ID", "TIME", "TYPE", "STATE", "MESSAGE"]
        assert [r.split()[3:5] for r in rows[1:]] == [["queued", "QUEUED"],
                                                      ["cancelled", "CANCELLED"]], rows
    finally:
        server.shutdown()
        server.server_close()
        server.app.close()
