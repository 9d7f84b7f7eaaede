"""Open streams per user (issue 52): each open stream holds a lease row in PostgreSQL, so a
user's streams are counted across every process; over the user's max_streams (default 10) a
new one answers 429 too_many_streams, and a closed stream frees its slot."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from conftest import AsgiServer
from stream_support import Sql, headers


def _leases(sql: Sql, name: str) -> int:
    return int(sql.one("SELECT count(*) FROM sftq.user_leases l JOIN sftq.users u "
                       "ON u.id = l.user_id WHERE u.name = %s AND l.expires_at > now()", name))


async def _open_many(url: str, key: str, n: int) -> tuple[list[Any], list[httpx.Response]]:
    """n concurrent GET /jobs/stream; the ones answered 200 are kept open."""
    client = httpx.AsyncClient(timeout=20)
    streams = [client.stream("GET", f"{url}/jobs/stream", headers=headers(key))
               for _ in range(n)]
    answers = await asyncio.gather(*(s.__aenter__() for s in streams))
    return [client, *streams], list(answers)


def test_25_streams_with_one_key_the_ones_over_the_limit_get_429(asgi: AsgiServer,
                                                                  sql: Sql) -> None:
    alice, bob = sql.user("alice"), sql.user("bob")

    async def scenario() -> None:
        held, answers = await _open_many(asgi.url, alice, 25)
        client, streams = held[0], held[1:]
        try:
            ok = [r for r in answers if r.status_code == 200]
            refused = [r for r in answers if r.status_code != 200]
            assert len(ok) == 10, [r.status_code for r in answers]
            for r in refused:
                assert r.status_code == 429
                body = await r.aread()
                assert b'"too_many_streams"' in body and b"10 SSE streams" in body
                assert r.headers["Retry-After"] == "10"
            assert _leases(sql, "alice") == 10
            # Another user is not touched by alice's limit.
            async with client.stream("GET", f"{asgi.url}/jobs/stream",
                                     headers=headers(bob)) as other:
                assert other.status_code == 200
            # A stream that ends frees its slot: then alice may open one again.
            i = answers.index(ok[0])
            await streams[i].__aexit__(None, None, None)
            deadline = time.monotonic() + 10
            while _leases(sql, "alice") > 9:
                assert time.monotonic() < deadline, "the closed stream kept its slot"
                await asyncio.sleep(0.05)
            async with client.stream("GET", f"{asgi.url}/jobs/stream",
                                     headers=headers(alice)) as again:
                assert again.status_code == 200
        finally:
            closed = streams[answers.index(ok[0])]
            for s in streams:
                if s is not closed:
                    await s.__aexit__(None, None, None)
            await client.aclose()

    asyncio.run(scenario())
    deadline = time.monotonic() + 10
    while _leases(sql, "alice"):
        assert time.monotonic() < deadline, "closed streams kept their slots"
        time.sleep(0.05)


def test_a_dead_process_leases_expire_and_the_refresh_renews_live_ones(asgi: AsgiServer,
                                                                       sql: Sql) -> None:
    alice = sql.user("alice")
    sql.one("SELECT sftq.set_user_limits('alice', NULL, NULL, 1, false, false, true)")
    uid = sql.uid("alice")
    # A lease left by a process that died: expired, it no longer counts.
    sql.one("INSERT INTO sftq.user_leases VALUES (gen_random_uuid(), %s, 'stream', "
            "now() - interval '10 minutes', now() - interval '1 second') RETURNING 1", uid)

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=20) as client, client.stream(
                "GET", f"{asgi.url}/jobs/stream", headers=headers(alice)) as first:
            assert first.status_code == 200
            before = sql.one("SELECT expires_at FROM sftq.user_leases "
                             "WHERE expires_at > now()")
            # The hub's refresh (every second in these tests) pushes the expiry on.
            deadline = time.monotonic() + 10
            while sql.one("SELECT expires_at FROM sftq.user_leases "
                          "WHERE expires_at > now()") == before:
                assert time.monotonic() < deadline, "the refresh did not renew the lease"
                await asyncio.sleep(0.1)
            async with client.stream("GET", f"{asgi.url}/jobs/stream",
                                     headers=headers(alice)) as second:
                assert second.status_code == 429

    asyncio.run(scenario())
