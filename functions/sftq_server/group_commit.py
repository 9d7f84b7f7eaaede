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
one thread, and a batch is whatever arrived while the previous one was in the database: the
loop hands over every request that is ready before the flush runs, so no linger is needed.
The batch itself runs in a thread of its own through the same code (GroupCommit.run), with
the same pool, retries and error mapping.
"""

from __future__ import annotations

import _thread
import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

from . import db as dbmod
from . import pg_arrays
from .errors import SftqError, Unavailable, from_sqlstate

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
        except Unavailable as exc:
            for r in batch:
                r.error = exc
            return
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
                return
            # Not a request's own mistake (those come back as rows): a surprise in the batch
            # must not fail its neighbours, so each is tried alone.
            logger.warning("a batch of %d enqueues failed (%s); trying each alone",
                           len(batch), type(exc).__name__)
            for r in batch:
                self._run([r])
            return
        for r, row in zip(batch, rows, strict=True):
            r.answer, r.error = answer_of(row)

    def _call(self, items: Sequence[Params]) -> list[tuple[Any, ...]]:
        rows = self._db.fetchall(dbmod.API_SUBMIT_MANY,
                                 (*batch_arrays(items), self._default_timeout))
        if len(rows) != len(items):
            raise SftqError(f"api_submit_many answered {len(rows)} rows for {len(items)}")
        return rows


class AsyncGroupCommit:
    """The group commit for requests served on an event loop (one per process).

    Requests wait as futures; one batch at a time runs in `executor` (give it a thread of its
    own, so that slow requests elsewhere never hold the enqueues up) through `runner.run`, and
    the requests that arrived meanwhile form the next batch, at most `runner`'s max batch."""

    def __init__(self, runner: GroupCommit, executor: Executor) -> None:
        self._runner = runner
        self._executor = executor
        self._waiting: deque[tuple[Slot, asyncio.Future[Slot]]] = deque()
        self._flush_task: asyncio.Task[None] | None = None

    async def submit(self, params: Params) -> Answer:
        """Enqueue one request; raises its SftqError (401, 400, 409, 503) like a lone call."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[Slot] = loop.create_future()
        self._waiting.append((Slot(params), answered))
        if self._flush_task is None:
            # Kept in an attribute: the loop holds tasks weakly.
            self._flush_task = loop.create_task(self._flush())
        slot = await answered
        if slot.error is not None:
            raise slot.error
        assert slot.answer is not None
        return slot.answer

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                n = min(len(self._waiting), self._runner.max_batch)
                batch = [self._waiting.popleft() for _ in range(n)]
                slots = [slot for slot, _ in batch]
                try:
                    await loop.run_in_executor(self._executor, self._runner.run, slots)
                except asyncio.CancelledError:  # the loop is closing: so are the requests
                    for _, answered in batch:
                        answered.cancel()
                    raise
                except RuntimeError as exc:  # the executor is shut down: the batch never ran
                    logger.warning("an enqueue batch could not run: %s", exc)
                    for slot in slots:
                        slot.error = Unavailable("the server is shutting down; retry shortly")
                for slot, answered in batch:
                    if not answered.done():  # a request whose client went away is cancelled
                        answered.set_result(slot)
        finally:
            self._flush_task = None
            while self._waiting:  # only when cancelled
                self._waiting.popleft()[1].cancel()
