"""The stream hub's bookkeeping against a real database: a refresh that runs while a stream
is opening keeps that stream's registration."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from conftest import FAST
from stream_support import Sql

from sftq_server import db as dbmod
from sftq_server.db import Database
from sftq_server.stream import StreamHub


def test_a_refresh_during_an_open_keeps_the_new_registration(db_url: str, sql: Sql) -> None:
    first, second = sql.user("u0"), sql.user("u1")
    sql.enqueue("u0")
    sql.enqueue("u1")

    def registered(hub: StreamHub, key: str) -> int:
        return int(sql.one("SELECT count(*) FROM sftq.stream_watchers w JOIN sftq.api_keys k "
                           "ON k.id = w.key_id WHERE w.instance = %s AND k.key_hash = %s",
                           hub.instance, hashlib.sha256(key.encode()).digest()))

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
                    seen.append(registered(hub, second))
                    hub._force_refresh = True
                    await hub.poll()
                    seen.append(registered(hub, second))
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
