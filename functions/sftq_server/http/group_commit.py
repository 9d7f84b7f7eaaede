"""Group commit for POST /jobs: the enqueues one process receives together share one round
trip and one transaction (sftq.api_submit_many), each with its own answer, its own
Idempotency-Key and its own place in the FIFO order.

Why: most of an enqueue's database cost is per statement and per transaction (each table's
constraints and indexes set up, the admission gate, the commit), not per job. In a batch of 8
a job costs the database less than half of what a lone enqueue costs (docs/performance.md).

How: no extra thread. A request that finds no batch in flight leads: it takes every request
waiting (its own first), runs them as one call, hands each its answer, then passes the lead
to the first request that arrived meanwhile, if any, and returns. Requests that arrive while
a batch is in the database wait for it and form the next one.

Lingering: under steady load the requests of one process come back together (their clients
send the next request when the answer arrives), but not at the same instant, so without a
wait the first of them would lead a batch of one and the rest would form the next batch: 40%
of the batches measured were of one request, each costing a whole transaction. So a leader
that finds fewer requests waiting than the largest of the last few batches (the process's
recent company) waits for that many to arrive, at most `linger` seconds, as PostgreSQL's
commit_delay does when it has commit_siblings. A lone request, with only lone requests
before it, is sent at once: nothing waits for company that has not been seen.

On an event loop (AsyncGroupCommit, used by the RSGI gateway) the requests wait as futures in
one thread, and a batch is whatever arrived while the previous one was in the database; it is
sent over the loop's own connection, with the same statement, retries and answers.
"""

from __future__ import annotations

import _thread
import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import psycopg

from sftq_server import db as dbmod
from sftq_server.core.errors import SftqError, Unavailable, from_sqlstate
from sftq_server.db import arrays as pg_arrays

logger = logging.getLogger("sftq.group_commit")

# Params of one request: key hash, kind, payload (JSON text), display name, gpu_count,
# Idempotency-Key, queue_timeout_seconds (what sftq.api_submit takes, but the default
# timeout, which belongs to the process).
Params = tuple[bytes, str, str, str | None, int, str | None, int | None]
Answer = tuple[str, bool, str]  # the 201 body, replayed, the job id


def batch_arrays(items: Sequence[Params]) -> tuple[pg_arrays.PackedArray, ...]:
    """The batch's seven columns as the arrays sftq.api_submit_many takes (db.API_SUBMIT_MANY),
    packed by pg_arrays rather than by psycopg's generic list dumper (see there why)."""
    keys, kinds, payloads, names, gpus, idems, timeouts = zip(*items, strict=True)
    return (pg_arrays.bytea_array(keys), pg_arrays.text_array(kinds),
            pg_arrays.jsonb_array(payloads), pg_arrays.text_array(names),
            pg_arrays.int4_array(gpus), pg_arrays.text_array(idems),
            pg_arrays.int4_array(timeouts))


def answer_of(row: tuple[Any, ...]) -> tuple[Answer | None, SftqError | None]:
    """One row of sftq.api_submit_many: the request's answer, or the error it alone gets."""
    body, replayed, job_id, err_state, err_message, err_detail = row[1:]
    if err_state is not None:
        return None, from_sqlstate(err_state, err_message, err_detail)
    return (body, bool(replayed), str(job_id)), None


class Slot:
    """One request of a batch: its params, then its answer or its error."""

    __slots__ = ("params", "answer", "error")

    def __init__(self, params: Params) -> None:
        self.params = params
        self.answer: Answer | None = None
        self.error: BaseException | None = None


class _Request(Slot):
    __slots__ = ("_done", "lead")

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        # Held until the request is answered or handed the lead. A bare lock rather than a
        # threading.Event: Event runs a Condition in Python for set() and wait() (about 7 us a
        # request on the bench machine against under 1 us), holding the interpreter lock the
        # process's other requests wait for.
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self.lead = False

    def wait(self) -> None:
        self._done.acquire()

    def wake(self) -> None:
        """Once per request: a second call raises (the lock is not held)."""
        self._done.release()


class GroupCommit:
    # How many past batches the expected company is read from.
    RECENT = 4

    def __init__(self, db: dbmod.Database, *, default_queue_timeout: int | None = None,
                 max_batch: int = 64, linger: float = 0.001) -> None:
        self._db = db
        self._default_timeout = default_queue_timeout
        self.max_batch = max(1, max_batch)
        self._linger = max(0.0, linger)
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._waiting: deque[_Request] = deque()
        self._leading = False
        self._expecting = 0  # while a leader lingers: how many waiting requests it waits for
        self._recent: deque[int] = deque([1], maxlen=self.RECENT)
        # Batch sizes seen, for the benchmark and the tests: (batches, requests).
        self.batches = 0
        self.requests = 0

    def submit(self, params: Params) -> Answer:
        """Enqueue one request; raises its SftqError (401, 400, 409, 503) like a lone call."""
        me = _Request(params)
        with self._lock:
            self._waiting.append(me)
            lead = not self._leading
            if lead:
                self._leading = True
            elif self._expecting and len(self._waiting) >= self._expecting:
                # The company a lingering leader waits for is here. Only then: waking it at
                # every arrival made it switch in and out of the CPU once per request.
                self._arrived.notify()
        if not lead:
            me.wait()
            lead = me.lead
        if lead:
            self._lead()
        if me.error is not None:
            raise me.error
        assert me.answer is not None
        return me.answer

    def _lead(self) -> None:
        with self._lock:
            self._linger_for_company()
            n = min(len(self._waiting), self.max_batch)
            batch = [self._waiting.popleft() for _ in range(n)]
            self._recent.append(n)
        try:
            self.run(batch)
        finally:
            with self._lock:
                nxt = self._waiting[0] if self._waiting else None
                if nxt is None:
                    self._leading = False
                else:
                    nxt.lead = True
            # The leader's own request is batch[0]: it returns, the others are woken.
            for r in batch[1:]:
                r.wake()
            if nxt is not None:
                nxt.wake()

    def _linger_for_company(self) -> None:
        """Under the lock: wait (at most `linger`) until as many requests are waiting as the
        largest recent batch, the company this process has been seeing."""
        expected = min(max(self._recent), self.max_batch)
        if self._linger <= 0 or len(self._waiting) >= expected:
            return
        deadline = time.monotonic() + self._linger
        self._expecting = expected
        try:
            while len(self._waiting) < expected:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._arrived.wait(left)
        finally:
            self._expecting = 0

    def run(self, batch: Sequence[Slot]) -> None:
        """Send one batch and give each slot its answer or its error, whatever happens."""
        try:
            self._run(batch)
        finally:
            for r in batch:
                if r.answer is None and r.error is None:  # _run itself was interrupted
                    r.error = SftqError("the enqueue was interrupted")

    def _run(self, batch: Sequence[Slot]) -> None:
        self.batches += 1
        self.requests += len(batch)
        try:
            rows = self._call([r.params for r in batch])
        except Exception as exc:
            if retry_alone(batch, exc):
                for r in batch:
                    self._run([r])
            return
        settle(batch, rows)

    def _call(self, items: Sequence[Params]) -> list[tuple[Any, ...]]:
        return self._db.fetchall(dbmod.API_SUBMIT_MANY,
                                 (*batch_arrays(items), self._default_timeout))


def retry_alone(batch: Sequence[Slot], exc: Exception) -> bool:
    """A batch's call failed: answer True when each request should be tried alone, else give
    them all the error. The database being unreachable is everyone's error, and a lone
    request's error is its own; any other surprise in a batch must not fail its neighbours
    (a request's own mistakes come back as rows, not as errors)."""
    if isinstance(exc, Unavailable) or len(batch) == 1:
        for r in batch:
            r.error = exc
        return False
    logger.warning("a batch of %d enqueues failed (%s); trying each alone",
                   len(batch), type(exc).__name__)
    return True


def settle(batch: Sequence[Slot], rows: list[tuple[Any, ...]]) -> None:
    """Give each request its row of sftq.api_submit_many: its answer or its own error."""
    if len(rows) != len(batch):
        error = SftqError(f"api_submit_many answered {len(rows)} rows for {len(batch)}")
        for r in batch:
            r.error = error
        return
    for r, row in zip(batch, rows, strict=True):
        r.answer, r.error = answer_of(row)


class AsyncGroupCommit:
    """The group commit on an event loop (the RSGI gateway), over one connection of its own.

    Requests wait as futures in the loop's thread. One batch at a time is in the database; the
    requests that arrive meanwhile form the next, at most `max_batch`. No thread takes part,
    so nothing waits for the interpreter lock between a batch's answer and its requests. The
    connection is opened on the first request and again after it breaks; a database that
    cannot be reached within `timeout` is a 503 for the batch, as in the threaded pool."""

    def __init__(self, url: str, *, default_queue_timeout: int | None = None,
                 max_batch: int = 64, linger: float = 0.001, timeout: float = 5.0) -> None:
        self._url = url
        self._default_timeout = default_queue_timeout
        self.max_batch = max(1, max_batch)
        self._linger = max(0.0, linger)
        self._timeout = timeout
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._waiting: deque[tuple[Slot, asyncio.Future[Slot]]] = deque()
        self._flush_task: asyncio.Task[None] | None = None
        self._recent: deque[int] = deque([1], maxlen=GroupCommit.RECENT)
        self._company: asyncio.Future[None] | None = None  # set once the expected are here
        self._expecting = 0
        self.batches = 0
        self.requests = 0

    async def submit(self, params: Params) -> Answer:
        """Enqueue one request; raises its SftqError (401, 400, 409, 503) like a lone call."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[Slot] = loop.create_future()
        self._waiting.append((Slot(params), answered))
        if self._flush_task is None:
            # Kept in an attribute: the loop holds tasks weakly.
            self._flush_task = loop.create_task(self._flush())
        elif self._company is not None and len(self._waiting) >= self._expecting:
            _done(self._company)
        slot = await answered
        if slot.error is not None:
            raise slot.error
        assert slot.answer is not None
        return slot.answer

    async def _flush(self) -> None:
        try:
            while self._waiting:
                await self._linger_for_company()
                n = min(len(self._waiting), self.max_batch)
                batch = [self._waiting.popleft() for _ in range(n)]
                self._recent.append(n)
                slots = [slot for slot, _ in batch]
                try:
                    await self._run(slots)
                except asyncio.CancelledError:  # the loop is closing: so are the requests
                    for _, answered in batch:
                        answered.cancel()
                    raise
                finally:
                    for slot in slots:
                        if slot.answer is None and slot.error is None:
                            slot.error = SftqError("the enqueue was interrupted")
                for slot, answered in batch:
                    if not answered.done():  # a request whose client went away is cancelled
                        answered.set_result(slot)
        finally:
            self._flush_task = None
            while self._waiting:  # only when cancelled
                self._waiting.popleft()[1].cancel()

    async def _linger_for_company(self) -> None:
        """GroupCommit's rule: wait (at most `linger`) until as many requests are waiting as
        the largest recent batch. The requests of a moment reach the loop one by one (granian
        hands each over from its own threads), so without it a batch often left a few behind
        that came a fraction of a millisecond later, each costing the next one transaction."""
        expected = min(max(self._recent), self.max_batch)
        if self._linger <= 0 or len(self._waiting) >= expected:
            return
        loop = asyncio.get_running_loop()
        self._company = company = loop.create_future()
        self._expecting = expected
        timer = loop.call_later(self._linger, _done, company)
        try:
            await company
        finally:
            timer.cancel()
            self._company = None
            self._expecting = 0

    async def _run(self, batch: list[Slot]) -> None:
        self.batches += 1
        self.requests += len(batch)
        try:
            rows = await self._call([r.params for r in batch])
        except Exception as exc:
            if retry_alone(batch, exc):
                for r in batch:
                    await self._run([r])
            return
        settle(batch, rows)

    async def _call(self, items: Sequence[Params]) -> list[tuple[Any, ...]]:
        try:
            conn = await self._connection()
            cur = await conn.execute(dbmod.API_SUBMIT_MANY,
                                     (*batch_arrays(items), self._default_timeout))
            return await cur.fetchall()
        except (OSError, TimeoutError) as exc:
            await self.close()
            raise dbmod.unreachable() from exc
        except psycopg.Error as exc:
            if self._conn is not None and self._conn.broken:
                await self.close()
            raise dbmod.translate(exc) from exc

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            kwargs = dbmod.connect_kwargs() | {"connect_timeout": max(1, int(self._timeout))}
            self._conn = await asyncio.wait_for(
                psycopg.AsyncConnection.connect(self._url, **kwargs), self._timeout)
        return self._conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
