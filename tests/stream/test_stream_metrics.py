"""sftq_stream_connections (issue 45): each stream server's registration refresh records how
many streams it holds open, and sftq.metrics() sums the live instances."""

from __future__ import annotations

import asyncio
import hashlib
import json

from conftest import FAST
from stream_support import Sql

from sftq_server.db import Database
from sftq_server.stream.hub import StreamHub


def connections(sql: Sql) -> int:
    return int(json.loads(sql.one("SELECT sftq.metrics()::text"))["stream_connections"])


def test_each_refresh_records_the_open_streams(db_url: str, sql: Sql) -> None:
    keys = [sql.user(f"u{i}") for i in range(3)]
    for i in range(3):
        sql.enqueue(f"u{i}")

    async def scenario() -> tuple[list[int], str]:
        db = Database(db_url, max_size=4, timeout=3.0)
        hubs = [StreamHub(db, FAST), StreamHub(db, FAST)]
        seen: list[int] = []
        try:
            # Two streams on one server, one on another: 3 across both.
            await hubs[0].open(hashlib.sha256(keys[0].encode()).digest(), None, None)
            await hubs[0].open(hashlib.sha256(keys[1].encode()).digest(), None, None)
            await hubs[1].open(hashlib.sha256(keys[2].encode()).digest(), None, None)
            for hub in hubs:
                hub._force_refresh = True
                await hub.poll()
            seen.append(connections(sql))
            # One closes; the next refresh says so.
            for stream in list(hubs[0].by_user.get(next(iter(hubs[0].by_user)), ())):
                hubs[0].detach(stream)
            hubs[0]._force_refresh = True
            await hubs[0].poll()
            seen.append(connections(sql))
            return seen, hubs[1].instance
        finally:
            for hub in hubs:
                await hub.aclose()
            db.close()

    seen, quiet = asyncio.run(scenario())
    assert seen == [3, 2]
    # A server that stopped refreshing drops out once its registration expires.
    sql.one("UPDATE sftq.stream_instances SET expires_at = now() - interval '1 second'"
            " WHERE instance = %s RETURNING 1", quiet)
    assert connections(sql) == 1
