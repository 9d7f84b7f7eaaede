"""Fixtures for the stream tests: a database per test, users with keys, and the stream served
for real on loopback, through the ASGI app (uvicorn, as functions-framework --asgi runs it)
and through the `sftq dev` gateway (werkzeug); clients read it with httpx-sse."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from stream_support import Sql

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.dev.pgcluster import free_port
from sftq_server.stream.hub import StreamApp, StreamHub, StreamSettings

FAST = StreamSettings(heartbeat_seconds=0.5, max_seconds=30.0, poll_ms=100.0,
                      refresh_seconds=1.0)


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(database_url=db_url, db_timeout_seconds=3.0)


@pytest.fixture
def sql(conn: psycopg.Connection[Any]) -> Sql:
    return Sql(conn)


@pytest.fixture
def stream_settings() -> StreamSettings:
    return FAST


class AsgiServer:
    """uvicorn serving StreamApp on 127.0.0.1 in a thread of its own."""

    def __init__(self, db_url: str, stream_settings: StreamSettings) -> None:
        import uvicorn

        self.db = Database(db_url, max_size=4, timeout=3.0)
        self.hubs: list[StreamHub] = []

        def build() -> StreamHub:
            hub = StreamHub(self.db, stream_settings)
            self.hubs.append(hub)
            return hub

        self.app = StreamApp(build)
        self.port = free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="stream-uvicorn")
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}/functions/v1/jobs-api"

    @property
    def hub(self) -> StreamHub:
        return self.hubs[0]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.db.close()


@pytest.fixture
def asgi(db_url: str, stream_settings: StreamSettings) -> Iterator[AsgiServer]:
    server = AsgiServer(db_url, stream_settings)
    try:
        yield server
    finally:
        server.stop()


class GatewayServer:
    """The `sftq dev` gateway (werkzeug, threaded) on 127.0.0.1 in a thread."""

    def __init__(self, settings: Settings) -> None:
        from sftq_server.http.gateway import make_server

        self.server = make_server("127.0.0.1", 0, settings, provider_factory=lambda: None)
        self.base = f"http://127.0.0.1:{self.server.port}"
        self.url = self.base + "/functions/v1/jobs-api"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, name="stream-gateway")
        self.thread.start()

    def stop(self) -> None:
        self.server.app.close()
        self.server.shutdown()
        self.thread.join(15)
        self.server.server_close()


@pytest.fixture
def gateway(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[GatewayServer]:
    monkeypatch.setenv("SFTQ_STREAM_HEARTBEAT_SECONDS", "0.5")
    monkeypatch.setenv("SFTQ_STREAM_POLL_MS", "100")
    monkeypatch.setenv("SFTQ_STREAM_MAX_SECONDS", "30")
    # The one Settings object reads SFTQ_STREAM_*, as a gateway started from the env does.
    server = GatewayServer(dataclasses.replace(settings, stream=StreamSettings.from_env()))
    try:
        yield server
    finally:
        server.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)
