"""The stream hub's bookkeeping against a real database: a refresh that runs while a stream
is opening keeps that stream's registration."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from conftest import FAST
from stream_support import Sql

from sftq_server import db as dbmod
from sftq_server.db import Database
from sftq_server.stream.hub import StreamHub


def registered(sql: Sql, hub: StreamHub, key: str) -> int:
    """How many registrations of `key` the hub's instance has (0 or 1)."""
    return int(sql.one("SELECT count(*) FROM sftq.stream_watchers w JOIN sftq.api_keys k "
                       "ON k.id = w.key_id WHERE w.instance = %s AND k.key_hash = %s",
                       hub.instance, hashlib.sha256(key.encode()).digest()))


def test_a_refresh_during_an_open_keeps_the_new_registration(db_url: str, sql: Sql) -> None:
    first, second = sql.user("u0"), sql.user("u1")
    sql.enqueue("u0")
    sql.enqueue("u1")

    async def scenario() -> list[int]:
        db = Database(db_url, max_size=4, timeout=3.0)
        hub = StreamHub(db, FAST)
        seen: list[int] = []
        try:
            await hub.open(hashlib.sha256(first.encode()).digest(), None, None)
            real = hub._db

            async def refresh_after_the_open_registers(query: str, params: Any) -> Any:
                rows = await real(query, params)
                if query == dbmod.STREAM_OPEN:
                    # The hub's refresh lands between this open's registration and its
                    # attach (as when many streams open at once).
                    seen.append(registered(sql, hub, second))
                    hub._force_refresh = True
                    await hub.poll()
                    seen.append(registered(sql, hub, second))
                return rows

            hub._db = refresh_after_the_open_registers  # type: ignore[method-assign]
            await hub.open(hashlib.sha256(second.encode()).digest(), None, None)
            return seen
        finally:
            await hub.aclose()
            db.close()

    # Registered by its open, and still registered after the refresh (which, knowing only the
    # attached streams, used to drop it: the poll then left the stream out and its backlog
    # read was refused with "the stream is no longer registered").
    assert asyncio.run(scenario()) == [1, 1]


def test_a_refresh_that_missed_an_open_does_not_end_its_stream(db_url: str, sql: Sql) -> None:
    """The other order: the refresh's keys were taken before an open began, and the open's
    registration committed before the refresh's statement ran. The refresh, not knowing the
    key, drops that registration; the stream must still get its frames (it used to read its
    backlog, be refused with "the stream is no longer registered" and end with reconnect)."""
    first, second = sql.user("u0"), sql.user("u1")
    sql.enqueue("u0")

    async def scenario() -> tuple[bool, bool, int]:
        db = Database(db_url, max_size=4, timeout=3.0)
        hub = StreamHub(db, FAST)
        opened: list[Any] = []
        try:
            # The hub's loop starts with this attach; its first poll is a refresh.
            await hub.open(hashlib.sha256(first.encode()).digest(), None, None)
            real = hub._db

            async def open_inside_the_refresh(query: str, params: Any) -> Any:
                if query == dbmod.STREAM_POLL and params[4] is not None and not opened:
                    opened.append(None)
                    opened[0] = await hub.open(hashlib.sha256(second.encode()).digest(),
                                               None, None)
                return await real(query, params)

            hub._db = open_inside_the_refresh  # type: ignore[method-assign]
            deadline = time.monotonic() + 5
            while not opened or opened[0] is None:
                assert time.monotonic() < deadline, "the hub never refreshed"
                await asyncio.sleep(0.02)
            stream = opened[0]
            job = await asyncio.to_thread(sql.enqueue, "u1")
            got = False
            while not got and not stream.done and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                got = any(isinstance(item, tuple) and job.encode() in item[0]
                          for item in stream._out)
            await asyncio.sleep(3 * FAST.poll_ms / 1000)
            return got, stream.done, registered(sql, hub, second)
        finally:
            await hub.aclose()
            db.close()

    got, done, still_registered = asyncio.run(scenario())
    assert (got, done) == (True, False)
    assert still_registered == 1
