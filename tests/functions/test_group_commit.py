"""Group commit of POST /jobs (sftq_server.http.group_commit): requests that arrive together share
one transaction, and each keeps its own answer, its own Idempotency-Key and its own place in
the FIFO order."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from fn_support import SFT_PAYLOAD, Api, Db
from werkzeug.test import Client

from sftq_server.core.errors import Conflict, SftqError, Unauthorized
from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.db import arrays as pg_arrays
from sftq_server.db.arrays import array_length
from sftq_server.http.apps import make_jobs_api
from sftq_server.http.group_commit import GroupCommit, Params, _Request
from sftq_server.http.web import wsgi_app

PAYLOAD = json.dumps(SFT_PAYLOAD, separators=(",", ":"))


def params(key: str, name: str = "n", *, kind: str = "SFT", payload: str = PAYLOAD,
           idem: str | None = None) -> Params:
    return (hashlib.sha256(key.encode()).digest(), kind, payload, name, 4, idem, None)


class HeldDatabase(Database):
    """The first call waits until released: the requests that arrive meanwhile queue up."""

    def __init__(self, url: str) -> None:
        super().__init__(url, max_size=4, timeout=5.0)
        self.release = threading.Event()
        self.entered = threading.Event()
        self.calls: list[int] = []

    def fetchall(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.calls.append(array_length(params[0]))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(10)
        return super().fetchall(query, params)


def run_together(gc: GroupCommit, db: HeldDatabase, first: Params,
                 rest: list[Params]) -> tuple[list[Any], list[Any]]:
    """`first` leads a batch held in the database while `rest` arrive one after another;
    answers (or errors) in the same order."""
    answers: list[Any] = [None] * (1 + len(rest))

    def go(i: int, p: Params) -> None:
        try:
            answers[i] = gc.submit(p)
        except SftqError as exc:
            answers[i] = exc

    threads = [threading.Thread(target=go, args=(0, first))]
    threads[0].start()
    assert db.entered.wait(10)
    for i, p in enumerate(rest, start=1):
        t = threading.Thread(target=go, args=(i, p))
        t.start()
        threads.append(t)
        # Arrival order is the FIFO order asked for: wait until this one is queued.
        deadline = time.monotonic() + 10
        while len(gc._waiting) < i and time.monotonic() < deadline:
            time.sleep(0.001)
    db.release.set()
    for t in threads:
        t.join(20)
    return answers[:1], answers[1:]


def test_requests_that_arrive_together_share_one_transaction(db_url: str, db: Db) -> None:
    keys = [db.user(f"u{i}") for i in range(6)]
    held = HeldDatabase(db_url)
    gc = GroupCommit(held)
    try:
        first, rest = run_together(gc, held, params(keys[0], "first"),
                                   [params(k, f"j{i}") for i, k in enumerate(keys * 2)])
    finally:
        held.close()
    assert held.calls == [1, 12] and (gc.batches, gc.requests) == (2, 13)
    ids = [a[2] for a in rest]
    assert all(not a[1] for a in [*first, *rest]) and len(set(ids)) == 12
    rows = db.conn.execute(
        "SELECT id::text, display_name, xmin::text FROM sftq.jobs WHERE id = ANY (%s::uuid[]) "
        "ORDER BY created_at, id", (ids,)).fetchall()
    # One transaction, and FIFO in arrival order.
    assert len({r[2] for r in rows}) == 1
    assert [r[1] for r in rows] == [f"j{i}" for i in range(12)]
    # Each body is what that request alone would get.
    for body, _, job_id in rest:
        doc = json.loads(body)
        assert doc["id"] == job_id and doc["state"] == "QUEUED" and doc["kind"] == "SFT"
    # The owners' bookkeeping is what twelve lone enqueues would leave.
    bad = db.conn.execute(
        "SELECT u.name FROM sftq.users u WHERE u.queued_count <> "
        "(SELECT count(*) FROM sftq.jobs j WHERE j.user_id = u.id AND j.state = 'QUEUED') "
        "OR u.head_job_id IS DISTINCT FROM (SELECT j.id FROM sftq.jobs j WHERE j.user_id = u.id "
        "AND j.state = 'QUEUED' ORDER BY j.created_at, j.id LIMIT 1)").fetchall()
    assert bad == []
    events = db.conn.execute(
        "SELECT count(*) FROM sftq.job_events WHERE job_id = ANY (%s::uuid[]) AND event = 'queued'",
        (ids,)).fetchone()
    assert events == (12,)


def test_a_batch_stores_every_text_exactly(db_url: str, db: Db) -> None:
    # The arrays go to the database in binary: quotes, backslashes, braces, commas, array
    # syntax, NULL spelled out, non-ASCII and empty strings come back as sent.
    key = db.user("alice")
    names = ['q"uote', "back\\slash", "{brace},comma", "NULL", "", "caf\u00e9 \u2603 \U0001f680",
             None, "  spaced  "]
    payloads = [json.dumps({"dataset": n if n is not None else "x", "nested": {"a": [1, "\\\""]}},
                           ensure_ascii=False, separators=(",", ":")) for n in names]
    idems = [None, 'idem"1', "idem\\2", None, "{}", None, None, "é"]
    held = HeldDatabase(db_url)
    gc = GroupCommit(held)
    try:
        first, rest = run_together(gc, held, params(key, "lead"), [
            (hashlib.sha256(key.encode()).digest(), "DPO", payload, name, 2, idem, 3600)
            for name, payload, idem in zip(names, payloads, idems, strict=True)])
    finally:
        held.close()
    assert held.calls == [1, len(names)]
    rows = {str(r[0]): r[1:] for r in db.conn.execute(
        "SELECT id, display_name, fireworks_payload::text, idempotency_key, kind, gpu_count, "
        "queue_timeout_seconds FROM sftq.jobs").fetchall()}
    for (_, _, job_id), name, payload, idem in zip(rest, names, payloads, idems, strict=True):
        stored_name, stored_payload, stored_idem, kind, gpus, timeout = rows[job_id]
        assert stored_name == name and stored_idem == idem
        assert json.loads(stored_payload) == json.loads(payload)
        assert (kind, gpus, timeout) == ("DPO", 2, 3600)


def test_packed_arrays_reach_the_database_as_psycopgs_own_lists_do(db: Db) -> None:
    # sftq_server.db.arrays packs the batch's arrays itself; each must arrive exactly as
    # psycopg's list dumper would have sent it, NULL elements and empty arrays included.
    texts = ['q"uote', None, "", "caf\u00e9 \U0001f680", "{a,b}", "NULL"]
    cases = [
        ("bytea", pg_arrays.bytea_array, [b"\x00\xff", None, b"", hashlib.sha256(b"k").digest()]),
        ("text", pg_arrays.text_array, texts),
        ("jsonb", pg_arrays.jsonb_array, ['{"a": [1, "\\u00e9"]}', None, "[]", '"s"']),
        ("int", pg_arrays.int4_array, [4, None, 0, -1, 2**31 - 1, -(2**31)]),
    ]
    for sqltype, pack, values in cases:
        for items in (values, values[:1], []):
            sent = pack(items)
            assert array_length(sent) == len(items)
            ours, theirs = db.conn.execute(
                f"SELECT %b::{sqltype}[], %b::{sqltype}[]", (sent, list(items))).fetchone()
            assert ours == theirs, (sqltype, items)
            if sqltype != "jsonb":  # jsonb comes back parsed
                assert ours == list(items)


def test_each_request_of_a_batch_gets_its_own_answer(db_url: str, db: Db) -> None:
    alice, bob, carol = db.user("alice"), db.user("bob"), db.user("carol")
    revoked = db.user("dave")
    db.conn.execute("SELECT sftq.revoke_key(%s)", (revoked,))
    db.conn.execute("SELECT sftq.set_user_disabled('carol', true)")
    held = HeldDatabase(db_url)
    gc = GroupCommit(held)
    try:
        first, rest = run_together(gc, held, params(alice, "lead"), [
            params(bob, "b1", idem="k1"),
            params("sftq_" + "x" * 43, "unknown key"),
            params(bob, "b1", idem="k1"),                      # the same request again
            params(bob, "b2", idem="k1"),                      # the same key, another body
            params(revoked, "revoked"),
            params(carol, "disabled"),
            params(alice, "fine"),
        ])
    finally:
        held.close()
    ok, unknown, replay, conflict, revoked_ans, disabled, fine = rest
    assert not ok[1] and replay == (ok[0], True, ok[2])
    assert isinstance(unknown, Unauthorized) and unknown.code == "unauthorized"
    assert isinstance(revoked_ans, Unauthorized) and isinstance(disabled, Unauthorized)
    assert isinstance(conflict, Conflict) and conflict.code == "idempotency_conflict"
    assert conflict.detail == {"job_id": ok[2]}
    assert isinstance(fine, tuple) and not fine[1]
    assert db.one("SELECT count(*) FROM sftq.jobs j JOIN sftq.users u ON u.id = j.user_id "
                  "WHERE u.name = 'bob'") == 1


def test_a_batch_answers_as_lone_requests_do(db_url: str, db: Db, api: Api) -> None:
    """Through HTTP: the status, code and message of each answer are those of the same
    request sent alone (the error envelope is shared)."""
    alice = db.user("alice")
    lone = api.submit(alice, headers={"Idempotency-Key": "same"})
    assert lone.status_code == 201
    again = api.submit(alice, headers={"Idempotency-Key": "same"}, display_name="other")
    assert again.status_code == 409
    held = HeldDatabase(db_url)
    gc = GroupCommit(held)
    try:
        _, rest = run_together(gc, held, params(alice, "lead"), [
            (hashlib.sha256(alice.encode()).digest(), "SFT", PAYLOAD, "other", 4, "same", None)])
    finally:
        held.close()
    (err,) = rest
    assert isinstance(err, Conflict)
    assert (err.status, err.code, err.message, err.detail) == (
        409, again.json["code"], again.json["error"], again.json.get("details"))


class FailingBatches(Database):
    def __init__(self, url: str) -> None:
        super().__init__(url, max_size=4, timeout=5.0)
        self.sizes: list[int] = []

    def fetchall(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.sizes.append(array_length(params[0]))
        if self.sizes[-1] > 1:
            raise SftqError("a surprise")
        return super().fetchall(query, params)


def test_a_batch_that_fails_is_retried_request_by_request(db_url: str, db: Db) -> None:
    keys = [db.user(f"u{i}") for i in range(4)]
    failing = FailingBatches(db_url)
    gc = GroupCommit(failing)
    items = [_Request(params(k)) for k in keys]
    try:
        gc._run(items)
    finally:
        failing.close()
    assert failing.sizes == [4, 1, 1, 1, 1]
    assert all(r.error is None and r.answer is not None for r in items)


def test_concurrent_posts_through_http_are_all_kept(settings: Settings, db: Db) -> None:
    keys = [db.user(f"u{i}") for i in range(8)]
    database = Database(settings.database_url, max_size=4, timeout=5.0)
    app = make_jobs_api(settings, db=database)
    statuses: list[int] = []
    lock = threading.Lock()

    def producer(key: str) -> None:
        client = Api(Client(wsgi_app(app)))
        for i in range(15):
            r = client.submit(key, display_name=f"{key[:10]}-{i}")
            with lock:
                statuses.append(r.status_code)

    threads = [threading.Thread(target=producer, args=(k,)) for k in keys * 2]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        app.close()
    assert statuses == [201] * 240
    assert db.one("SELECT count(*) FROM sftq.jobs") == 240
    assert db.one("SELECT count(*) FROM sftq.job_events WHERE event = 'queued'") == 240
    assert db.one(
        "SELECT count(*) FROM sftq.users u WHERE u.queued_count <> "
        "(SELECT count(*) FROM sftq.jobs j WHERE j.user_id = u.id AND j.state = 'QUEUED')") == 0


@pytest.mark.parametrize("size", [1, 3])
def test_group_commit_max_bounds_a_batch(db_url: str, db: Db, size: int) -> None:
    keys = [db.user(f"u{i}") for i in range(7)]
    held = HeldDatabase(db_url)
    gc = GroupCommit(held, max_batch=size)
    try:
        run_together(gc, held, params(keys[0]), [params(k) for k in keys[1:]])
    finally:
        held.close()
    assert max(held.calls) <= size and sum(held.calls) == 7


class CountingDatabase:
    """Answers every batch at once and records its size."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def fetchall(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        n = array_length(params[0])
        self.calls.append(n)
        return [(i, "{}", False, f"job{len(self.calls)}-{i}", None, None, None)
                for i in range(n)]


def submit_in_threads(gc: GroupCommit, count: int, *, gap: float = 0.0) -> list[threading.Thread]:
    threads = []
    for i in range(count):
        th = threading.Thread(target=gc.submit, args=(params(f"k{i}"),))
        th.start()
        threads.append(th)
        time.sleep(gap)
    return threads


def test_a_lone_request_is_sent_at_once() -> None:
    """Nothing waits for company the process has not seen: lone requests never linger."""
    db = CountingDatabase()
    gc = GroupCommit(db, linger=5.0)  # type: ignore[arg-type]
    started = time.monotonic()
    for _ in range(3):
        gc.submit(params("k"))
    assert time.monotonic() - started < 1.0 and db.calls == [1, 1, 1]


def test_a_leader_lingers_for_the_company_of_recent_batches() -> None:
    """After a batch of three, a leader waits (at most `linger`) until three are waiting:
    requests arriving 50 ms apart share one transaction instead of leading one each."""
    db = CountingDatabase()
    gc = GroupCommit(db, linger=5.0)  # type: ignore[arg-type]
    gc._recent.append(3)  # as if the last batch held three requests
    started = time.monotonic()
    for th in submit_in_threads(gc, 3, gap=0.05):
        th.join(10)
    assert db.calls == [3] and time.monotonic() - started < 2.0


def test_lingering_is_bounded() -> None:
    """When the expected company does not come, the leader goes alone after `linger`."""
    db = CountingDatabase()
    gc = GroupCommit(db, linger=0.2)  # type: ignore[arg-type]
    gc._recent.append(8)
    started = time.monotonic()
    gc.submit(params("k"))
    waited = time.monotonic() - started
    assert db.calls == [1] and 0.15 <= waited < 2.0
    # linger=0 turns it off.
    gc = GroupCommit(db, linger=0)  # type: ignore[arg-type]
    gc._recent.append(8)
    started = time.monotonic()
    gc.submit(params("k"))
    assert time.monotonic() - started < 0.1
