"""A design under study, not a deployment: POST /jobs on granian's RSGI interface, with the
group commit as asyncio tasks over one database connection per process.

    granian --interface rsgi --workers 2 --working-dir bench rsgi_jobs:app

The enqueue section measures it beside the WSGI servers to see what serving the hot route on
an event loop would give (docs/performance.md, Enqueue): the requests of a batch wait as
coroutines in one thread instead of as blocking threads handing the interpreter lock and the
batch to each other. It answers POST /jobs as the jobs-api does (the same checks, statement,
201 body and access-log line) and GET with 200 for the bench's readiness probe; nothing else.
A batch is every request that arrived while the connection was busy, as in the threaded
group commit, without its linger. What a deployment would also need (every other route on a
thread pool, reconnects, a batch that fails retried request by request) is left out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

import psycopg

from sftq_server import db as dbmod
from sftq_server.api import authenticate, check_json_content_type, idempotency_key, parse_submit
from sftq_server.group_commit import Params, answer_of, batch_arrays
from sftq_server.web import JSON, Headers, Request, error_response

access_log = logging.getLogger("sftq.access")


class AsyncGroupCommit:
    def __init__(self, url: str) -> None:
        self._url = url
        self._waiting: list[tuple[Params, asyncio.Future[Any]]] = []
        self._conn: asyncio.Queue[psycopg.AsyncConnection[Any]] | None = None
        self._flushing = False

    async def submit(self, params: Params) -> tuple[str, bool, str]:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        self._waiting.append((params, answer))
        if not self._flushing:
            self._flushing = True
            loop.create_task(self._flush())
        result: tuple[str, bool, str] = await answer
        return result

    async def _flush(self) -> None:
        try:
            if self._conn is None:
                self._conn = asyncio.Queue()
                self._conn.put_nowait(await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, prepare_threshold=None))
            while self._waiting:
                conn = await self._conn.get()  # while it is busy, more requests join the batch
                batch, self._waiting = self._waiting, []
                asyncio.get_running_loop().create_task(self._send(conn, batch))
        finally:
            self._flushing = False

    async def _send(self, conn: psycopg.AsyncConnection[Any],
                    batch: list[tuple[Params, asyncio.Future[Any]]]) -> None:
        assert self._conn is not None
        try:
            cur = await conn.execute(dbmod.API_SUBMIT_MANY,
                                     (*batch_arrays([p for p, _ in batch]), None))
            rows = await cur.fetchall()
        except Exception as exc:  # noqa: BLE001 - every request of the batch gets it
            for _, answer in batch:
                answer.set_exception(exc)
            return
        finally:
            self._conn.put_nowait(conn)
        for (_, answer), row in zip(batch, rows, strict=True):
            result, error = answer_of(row)
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(result)


group_commit = AsyncGroupCommit(os.environ["DATABASE_URL"])


async def app(scope: Any, proto: Any) -> None:
    if scope.proto != "http":
        return
    if scope.method == "GET":
        proto.response_bytes(200, [("content-type", JSON)], b'{"status":"ok"}')
        return
    started = time.perf_counter()
    request = Request(scope.method, scope.path, headers=Headers(scope.headers.items()))
    try:
        key_hash = authenticate(request)
        check_json_content_type(request)
        idem = idempotency_key(request)
        req, payload = parse_submit(await proto())
        body, replayed, job_id = await group_commit.submit(
            (key_hash, req.kind, payload, req.display_name, req.gpu_count, idem,
             req.queue_timeout_seconds))
        request.job_id = job_id
        status, out = 201, body.encode()
        headers = [("content-type", JSON), ("location", f"/jobs/{job_id}")]
        if replayed:
            headers.append(("idempotent-replayed", "true"))
    except Exception as exc:  # noqa: BLE001 - mapped as the WSGI app maps it
        response = error_response(exc)
        status, out, headers = response.status, response.body, response.headers
    if access_log.isEnabledFor(logging.INFO):
        access_log.info(json.dumps({
            "fn": "jobs-api", "method": request.method, "route": "/jobs", "status": status,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "user": request.user, "job_id": request.job_id}))
    proto.response_bytes(status, headers, out)
