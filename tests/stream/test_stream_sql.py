"""The stream's ordering guarantees, at the SQL level, with transactions interleaved on purpose."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from stream_support import Sql

INSTANCE = "test-instance-0123456789abcdef"


def _open(conn: psycopg.Connection[Any], key_hash: bytes) -> int:
    rows = conn.execute(
        "SELECT frame, data FROM sftq.api_stream_open(%s, %s, NULL, NULL, NULL, 120, 100)",
        (key_hash, INSTANCE)).fetchall()
    return int(json.loads(rows[0][1])["horizon"])


def _poll(conn: psycopg.Connection[Any], after: tuple[int, int]) -> tuple[list[tuple[Any, ...]],
                                                                          tuple[int, int]]:
    rows = conn.execute(
        "SELECT frame, id, txid, job_id, state, data FROM sftq.stream_poll(%s, %s::xid8, %s, 100)",
        (INSTANCE, str(after[0]), after[1])).fetchall()
    horizon = int(json.loads(rows[0][5])["horizon"])
    frames = [r for r in rows[1:] if r[0] != "scan"]
    scan = next(r for r in rows if r[0] == "scan")
    cursor = max(after, (horizon, 0)) if json.loads(scan[5])["scanned"] < 100 else \
        (int(scan[2]), int(scan[1]))
    return frames, cursor


def test_a_row_committed_after_a_higher_id_is_not_stepped_over(db_url: str, sql: Sql) -> None:
    import hashlib

    key = sql.user("alice")
    job = sql.enqueue("alice")
    sql.admit()
    key_hash = hashlib.sha256(key.encode()).digest()
    with psycopg.connect(db_url, autocommit=True) as reader, \
            psycopg.connect(db_url) as t1, psycopg.connect(db_url) as t2:
        cursor = (_open(reader, key_hash), 0)
        # T1 takes the lower id and stays open; T2 takes a higher id and commits first.
        t1.execute("SELECT sftq._event(%s, now(), 'test', 'provider_state', 'PROGRESS', "
                   "'{\"provider_state\": \"A\"}')", (job,))
        low = t1.execute("SELECT max(id) FROM sftq.job_events").fetchone()
        t2.execute("SELECT sftq._event(%s, now(), 'test', 'provider_state', 'PROGRESS', "
                   "'{\"provider_state\": \"B\"}')", (job,))
        t2.commit()
        high = reader.execute("SELECT max(id) FROM sftq.job_events").fetchone()
        assert low is not None and high is not None and high[0] > low[0]
        # What an "id > cursor" reader would do now: see B, move past A for good.
        naive = reader.execute("SELECT id FROM sftq.job_events WHERE id > %s", (low[0] - 1,))
        assert [r[0] for r in naive] == [high[0]]
        frames, cursor = _poll(reader, cursor)
        assert frames == []  # T1 is still open: nothing at or above its txid is handed out
        t1.commit()
        frames, cursor = _poll(reader, cursor)
        got = [json.loads(f[5])["provider_state"] for f in frames]
        assert got == ["B", "A"] or got == ["A", "B"]
        assert sorted(f[1] for f in frames) == [low[0], high[0]]
        frames, cursor = _poll(reader, cursor)
        assert frames == []  # and never twice


def test_a_writer_that_got_its_transaction_id_early_still_sorts_after(db_url: str,
                                                                       sql: Sql) -> None:
    sql.user("alice")
    job = sql.enqueue("alice")
    sql.admit()
    with psycopg.connect(db_url) as early, psycopg.connect(db_url) as late:
        # `early` gets a transaction id first (any write), then waits for the job's row lock
        # while `late` writes an event of the job and commits.
        early.execute("UPDATE sftq.users SET max_running = max_running WHERE name = 'alice'")
        late.execute("SELECT 1 FROM sftq.jobs WHERE id = %s FOR UPDATE", (job,))
        late.execute("SELECT sftq._event(%s, now(), 'test', 'provider_state', 'PROGRESS', "
                     "'{\"provider_state\": \"first\"}')", (job,))
        late.commit()
        early.execute("SELECT 1 FROM sftq.jobs WHERE id = %s FOR UPDATE", (job,))
        early.execute("SELECT sftq._event(%s, now(), 'test', 'provider_state', 'PROGRESS', "
                      "'{\"provider_state\": \"second\"}')", (job,))
        early.commit()
    rows = sql.conn.execute(
        "SELECT detail->>'provider_state' FROM sftq.job_events "
        "WHERE job_id = %s AND event = 'provider_state' ORDER BY txid, id", (job,)).fetchall()
    assert [r[0] for r in rows] == ["first", "second"], rows


def test_queue_frames_are_written_at_a_tick_end_only_for_watched_users(sql: Sql) -> None:
    import hashlib

    alice = sql.user("alice")
    sql.user("bob")
    for _ in range(2):
        sql.enqueue("bob")
    mine = sql.enqueue("alice", gpus=8)
    sql.tick()
    assert sql.one("SELECT count(*) FROM sftq.stream_queue_events") == 0  # nobody watches
    _open(sql.conn, hashlib.sha256(alice.encode()).digest())
    sql.tick()
    rows = sql.conn.execute("SELECT job_id::text, queue_position FROM sftq.stream_queue_events"
                            ).fetchall()
    assert rows == [(mine, 2)]
    sql.tick()
    assert sql.one("SELECT count(*) FROM sftq.stream_queue_events") == 1  # unchanged: none
    assert len(sql.admit(4)) == 1  # bob's first starts: alice's job moves up
    sql.tick()
    assert sql.conn.execute("SELECT queue_position FROM sftq.stream_queue_events ORDER BY id"
                            ).fetchall() == [(2,), (1,)]
    assert sql.conn.execute("SELECT DISTINCT user_id FROM sftq.stream_queue_events"
                            ).fetchall() == [(sql.uid("alice"),)]
