"""The live stream: GET /jobs/{id}/stream and GET /jobs/stream as Server-Sent Events.

One `StreamHub` per process serves every open stream. It holds no database connection while
streams are idle: every `poll_ms` it runs ONE query (sftq.stream_poll) that answers the new
frames of all users this instance streams for, and hands each frame, encoded once, to the
streams that want it. Opening a stream is one more query (sftq.api_stream_open: auth, the
snapshot or the backlog after Last-Event-ID). Heartbeats and the end of a stream's life are
timers in the event loop. Why positions are (txid, id) and how nothing is missed or sent
twice: sql/procedures/140_stream.sql and docs/api.md (Live updates).

Fronts: `StreamApp` is an ASGI application (functions-framework `--asgi`, uvicorn);
`WsgiStreams` serves the same streams from a WSGI server (the `sftq dev` gateway) by running
the hub's event loop in a thread of its own, one server thread per open stream.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import logging
import re
import secrets
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sftq_server import db as dbmod
from sftq_server.core.errors import (
    BadRequest,
    MethodNotAllowed,
    NotFound,
    SftqError,
    Unauthorized,
    Unavailable,
)
from sftq_server.core.settings import Settings, StreamSettings
from sftq_server.http.checks import authenticate, job_id_param
from sftq_server.http.web import (
    Headers,
    Request,
    Response,
    StartResponse,
    error_response,
    status_line,
)
from sftq_server.stream.paths import parse_stream_path

logger = logging.getLogger("sftq.stream")
T = TypeVar("T")
access_log = logging.getLogger("sftq.access")

Position = tuple[int, int]

_LAST_EVENT_ID_RE = re.compile(r"[0-9]{1,18}|h[0-9]{1,20}")
_BAD_LAST_EVENT_ID = "Last-Event-ID is not an id this stream sent you; reconnect without it"
TERMINAL = frozenset({"SUCCESS", "FAIL", "CANCELLED"})
STREAM_HEADERS: tuple[tuple[str, str], ...] = (
    ("Content-Type", "text/event-stream"),
    ("Cache-Control", "no-store"),
    # nginx and some other proxies buffer responses unless told not to.
    ("X-Accel-Buffering", "no"),
)
# Threads the stream loop hands blocking database calls to, at most.
IO_THREADS = 4
PING = b": ping\n\n"
# Sent first, so the response's headers go out at once even when nothing is to say yet (a
# server sends them with the first body bytes): a reader then knows it is connected instead
# of waiting for the first heartbeat. A comment: SSE readers skip it.
OPENING = b": connected\n\n"


def _token(position_id: int, txid: int) -> str:
    return str(position_id) if position_id > 0 else f"h{txid}"


def encode(frame: str, token: str, data: str) -> bytes:
    # data is one line of JSON (the database writes no raw newlines inside JSON text).
    return f"id: {token}\nevent: {frame}\ndata: {data}\n\n".encode()


@dataclass
class Row:
    frame: str
    id: int
    txid: int
    job_id: str | None
    user_id: int | None
    state: str | None
    data: str

    @property
    def position(self) -> Position:
        return (self.txid, self.id)


def _rows(raw: Sequence[tuple[Any, ...]]) -> list[Row]:
    return [Row(r[0], int(r[1] or 0), int(r[2] or 0), None if r[3] is None else str(r[3]),
                r[4], r[5], r[6]) for r in raw]


_END = object()
_RECONNECT = object()
_CLOSE = object()


class Stream:
    """One open stream. The hub fills it (in the event loop); `chunks()` drains it."""

    def __init__(self, hub: StreamHub, key_hash: bytes, job_id: str | None) -> None:
        self.hub = hub
        self.key_hash = key_hash
        self.job_id = job_id
        self.user_id = 0
        self.key_prefix: str | None = None
        # Every row at or below `covered` is delivered or predates the stream (its snapshot or
        # resume point); `synced`: the hub's windows carry it on from there.
        self.covered: Position = (0, 0)
        self.synced = False
        self.backfilling = False
        self.last: Position = (0, 0)
        self.token = ""  # id of the last frame queued, or the starting point
        self.sent_token = ""  # id of the last frame handed to the transport
        self.frames_sent = 0
        self._out: collections.deque[Any] = collections.deque()
        self._wake = asyncio.Event()
        self.done = False
        self.opened = time.monotonic()
        # The row that counts this stream against its user's max_streams, in every process
        # (sftq.user_leases): taken before it opens, renewed by the hub's refresh, freed when
        # it ends.
        self.lease = str(uuid.uuid4())

    # -- filled by the hub -------------------------------------------------------------
    def deliver(self, rows: Iterable[tuple[Row, bytes]]) -> None:
        if self.done:
            return
        floor = max(self.covered, self.last)
        for row, chunk in rows:
            pos = row.position
            if pos <= floor:
                continue
            if self.job_id is not None and row.job_id != self.job_id:
                continue
            self.last = floor = pos
            self.token = _token(row.id, row.txid)
            self._out.append((chunk, self.token))
            if self.job_id is not None and row.frame == "status" and row.state in TERMINAL:
                self.finish(_END)
                return
        if len(self._out) > self.hub.settings.max_queued:
            self._out.clear()
            self.finish(_RECONNECT)
        self._wake.set()

    def finish(self, how: object) -> None:
        if not self.done:
            self.done = True
            self._out.append(how)
            self._wake.set()
            self.hub.detach(self)

    def close(self) -> None:
        """The client went away (or the server stops)."""
        self.finish(_CLOSE)

    # -- drained by the front ------------------------------------------------------------
    async def chunks(self) -> AsyncGenerator[bytes, None]:
        settings = self.hub.settings
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.max_seconds
        self.sent_token = self.token
        try:
            yield OPENING
            while True:
                if not self._out:
                    self._wake.clear()
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        self.finish(_RECONNECT)
                    else:
                        try:
                            await asyncio.wait_for(self._wake.wait(),
                                                   min(settings.heartbeat_seconds, remaining))
                        except TimeoutError:
                            if loop.time() < deadline:
                                yield PING
                            continue
                parts: list[bytes] = []
                while self._out:
                    item = self._out.popleft()
                    if item is _CLOSE:
                        return
                    if item is _END or item is _RECONNECT:
                        if parts:
                            yield b"".join(parts)
                        name = "end" if item is _END else "reconnect"
                        data = json.dumps({"job_id": self.job_id} if self.job_id else {})
                        yield encode(name, self.sent_token, data)
                        return
                    chunk, token = item
                    parts.append(chunk)
                    self.sent_token = token
                    self.frames_sent += 1
                if parts:
                    yield b"".join(parts)
        finally:
            self.close()


class StreamHub:
    """Every open stream of this process, and the one poll that feeds them."""

    def __init__(self, db: dbmod.Database, settings: StreamSettings | None = None) -> None:
        self.db = db
        self.settings = settings or Settings.from_env().stream
        # Random and secret: the database answers a poll only for users registered under it.
        self.instance = secrets.token_hex(16)
        self.cursor: Position | None = None
        self.by_user: dict[int, set[Stream]] = {}
        self.unsynced: set[Stream] = set()
        # Keys of streams still opening (registered by their open, not attached yet): a
        # refresh must re-register them too, or it would drop the registration their open
        # just wrote and the poll would not carry them.
        self._opening: collections.Counter[bytes] = collections.Counter()
        self._task: asyncio.Task[None] | None = None
        self._next_refresh = 0.0
        self._force_refresh = False
        self.queries = 0
        self.polls = 0
        self.frames = 0
        # Leases of streams that ended, freed together by one task at a time.
        self._to_release: list[str] = []
        self._releasing: asyncio.Task[None] | None = None

    @property
    def open_streams(self) -> int:
        return sum(len(s) for s in self.by_user.values())

    async def _db(self, query: str, params: Sequence[Any]) -> list[Row]:
        try:
            return _rows(await asyncio.to_thread(self.db.fetchall, query, params))
        finally:
            # Counted once the query is done, as poll() counts its poll: counted before it, a
            # reader of both counters during a poll saw one query more than polls.
            self.queries += 1

    # -- opening -------------------------------------------------------------------------
    async def open(self, key_hash: bytes, job_id: str | None, last_event_id: str | None,
                   key_prefix: str | None = None) -> Stream:
        if last_event_id is not None and not _LAST_EVENT_ID_RE.fullmatch(last_event_id):
            raise BadRequest(_BAD_LAST_EVENT_ID)
        stream = Stream(self, key_hash, job_id)
        stream.key_prefix = key_prefix
        # The user's slot first: over max_streams this is the 429 too_many_streams, and a
        # bad key the 401, before anything else is read.
        await asyncio.to_thread(self.db.scalar, dbmod.API_LEASE_TAKE, (
            key_hash, stream.lease, "stream", self.settings.watch_ttl_seconds))
        self._opening[key_hash] += 1
        try:
            opened = await self._open(stream, key_hash, job_id, last_event_id)
        except BaseException:
            self.release(stream.lease)
            raise
        else:
            if opened.done:  # ended at once (a finished job's stream): it holds no slot
                self.release(stream.lease)
            return opened
        finally:
            self._opening[key_hash] -= 1
            if not self._opening[key_hash]:
                del self._opening[key_hash]

    async def _open(self, stream: Stream, key_hash: bytes, job_id: str | None,
                    last_event_id: str | None) -> Stream:
        floor = None if self.cursor is None else str(self.cursor[0])
        rows = await self._db(dbmod.STREAM_OPEN, (
            key_hash, self.instance, job_id, last_event_id, floor,
            self.settings.watch_ttl_seconds, self.settings.page_rows))
        meta = json.loads(rows[0].data)
        stream.user_id = int(meta["user_id"])
        horizon = int(meta["horizon"])
        after = meta.get("after")
        if after is not None:
            stream.last = (int(after[0]), int(after[1]))
            stream.token = last_event_id or ""
        else:
            stream.token = f"h{horizon}"
        frames = [r for r in rows[1:] if r.frame != "scan"]
        scan = next((r for r in rows if r.frame == "scan"), None)
        self._deliver_rows(stream, frames)
        # A resumed stream pages through its backlog up to the horizon.
        while scan is not None and json.loads(scan.data)["scanned"] >= self.settings.page_rows:
            more = await self._db(dbmod.STREAM_BACKLOG, (
                self.instance, stream.user_id, job_id, str(scan.txid), scan.id, str(horizon),
                self.settings.page_rows))
            scan = next((r for r in more if r.frame == "scan"), None)
            self._deliver_rows(stream, [r for r in more if r.frame != "scan"])
        stream.covered = max(stream.covered, (horizon, 0))
        if job_id is not None and meta.get("job_state") in TERMINAL and not stream.done:
            stream.finish(_END)
        if not stream.done:
            self._attach(stream)
        return stream

    def _deliver_rows(self, stream: Stream, rows: list[Row]) -> None:
        stream.deliver((r, encode(r.frame, _token(r.id, r.txid), r.data)) for r in rows)

    def _attach(self, stream: Stream) -> None:
        self.by_user.setdefault(stream.user_id, set()).add(stream)
        self.unsynced.add(stream)
        if self.cursor is None:
            self.cursor = stream.covered
        if self._task is None or self._task.done():
            self._force_refresh = True
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sftq-stream-hub")

    def detach(self, stream: Stream) -> None:
        streams = self.by_user.get(stream.user_id)
        if streams is not None and stream in streams:
            streams.discard(stream)
            if not streams:
                del self.by_user[stream.user_id]
            self.release(stream.lease)
        self.unsynced.discard(stream)

    # -- the streams' slots (sftq.user_leases) ---------------------------------------------
    def release(self, lease: str) -> None:
        """Free an ended stream's slot soon (a failed release expires with its TTL)."""
        self._to_release.append(lease)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: left to expire
        if self._releasing is None or self._releasing.done():
            self._releasing = loop.create_task(self._release_leases())

    async def _release_leases(self) -> None:
        while self._to_release:
            leases, self._to_release = self._to_release, []
            try:
                await asyncio.to_thread(self.db.scalar, dbmod.API_LEASES_RELEASE, (leases,))
            except Exception as exc:  # noqa: BLE001 - they expire with their TTL
                logger.warning("could not free %d stream slots (%s); they expire",
                               len(leases), exc)

    async def _renew_leases(self) -> None:
        leases = [s.lease for ss in self.by_user.values() for s in ss]
        if leases:
            await asyncio.to_thread(self.db.scalar, dbmod.API_LEASES_RENEW,
                                    (leases, self.settings.watch_ttl_seconds))

    # -- polling -------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.settings.poll_ms / 1000.0
        failures = 0
        while self.by_user:
            started = loop.time()
            try:
                await self.poll()
                failures = 0
            except SftqError as exc:
                failures += 1
                self._force_refresh = True
                logger.warning("stream poll failed (%s); streams keep their place", exc.message)
            except Exception:
                failures += 1
                self._force_refresh = True
                logger.exception("stream poll failed; streams keep their place")
            pause = interval if not failures else min(interval * 2 ** failures, 10.0)
            await asyncio.sleep(max(0.0, pause - (loop.time() - started)))

    async def poll(self) -> None:
        """One query for every open stream of this process; then hand out the frames."""
        assert self.cursor is not None
        now = time.monotonic()
        hashes: list[bytes] | None = None
        if self._force_refresh or now >= self._next_refresh:
            hashes = sorted({s.key_hash for ss in self.by_user.values() for s in ss}
                            | self._opening.keys())
        rows = await self._db(dbmod.STREAM_POLL, (
            self.instance, str(self.cursor[0]), self.cursor[1], self.settings.page_rows,
            hashes, self.settings.watch_ttl_seconds,
            # The refresh also records this process's open streams (sftq_stream_connections).
            self.open_streams if hashes is not None else None))
        if hashes is not None:
            self._force_refresh = False
            self._next_refresh = now + self.settings.refresh_seconds
            # The streams' slots live as long as this process refreshes them.
            await self._renew_leases()
        self.polls += 1
        meta = json.loads(rows[0].data)
        horizon = int(meta["horizon"])
        gone = {bytes.fromhex(h) for h in meta.get("gone") or ()}
        scan = next(r for r in rows if r.frame == "scan")
        frames = [r for r in rows[1:] if r.frame != "scan"]
        if json.loads(scan.data)["scanned"] >= self.settings.page_rows:
            new_cursor: Position = scan.position
        else:
            new_cursor = max((horizon, 0), self.cursor)
        self.distribute(self.cursor, new_cursor, frames, {int(u) for u in meta["users"]})
        self.cursor = new_cursor
        if gone:
            # A revoked key or disabled user: the stream ends; its reconnect answers 401.
            for streams in list(self.by_user.values()):
                for s in list(streams):
                    if s.key_hash in gone:
                        s.finish(_RECONNECT)

    def distribute(self, lo: Position, hi: Position, rows: list[Row],
                   covered_users: set[int]) -> None:
        """Hand the frames of the window (lo, hi] to every stream; each encoded once."""
        by_user: dict[int, list[tuple[Row, bytes]]] = {}
        for r in rows:
            by_user.setdefault(r.user_id or 0, []).append(
                (r, encode(r.frame, _token(r.id, r.txid), r.data)))
        self.frames += len(rows)
        if len(covered_users) != len(self.by_user) or not covered_users.issuperset(self.by_user):
            # A user the poll did not cover: its registration was not visible to the poll's
            # snapshot yet, or it is gone (a refresh whose keys were taken before that
            # stream's open began, but which ran after the open registered, drops it). Its
            # streams read this window themselves, and the next poll re-registers every key.
            for user_id, streams in self.by_user.items():
                if user_id not in covered_users:
                    self._force_refresh = True
                    for s in streams:
                        if s.synced:
                            s.synced = False
                            s.covered = max(s.covered, lo)
                            self.unsynced.add(s)
        for user_id, items in by_user.items():
            for s in list(self.by_user.get(user_id, ())):
                if s.synced:
                    s.deliver(items)
        for s in list(self.unsynced):
            if s.backfilling or s.done:
                continue
            if s.user_id in covered_users and s.covered >= lo:
                # Its snapshot or backlog reaches this window: from here the hub carries it.
                s.deliver(by_user.get(s.user_id, ()))
                s.synced = True
                self.unsynced.discard(s)
            else:
                s.backfilling = True
                asyncio.get_running_loop().create_task(self._backfill(s))

    async def _backfill(self, s: Stream) -> None:
        """A stream the poll has not carried yet: read the rows up to the poll's cursor."""
        try:
            while not s.done and self.cursor is not None and s.covered < (self.cursor[0], 0):
                upto = self.cursor[0]
                after = max(s.last, s.covered)
                rows = await self._db(dbmod.STREAM_BACKLOG, (
                    self.instance, s.user_id, s.job_id, str(after[0]), after[1], str(upto),
                    self.settings.page_rows))
                scan = next(r for r in rows if r.frame == "scan")
                self._deliver_rows(s, [r for r in rows if r.frame != "scan"])
                if json.loads(scan.data)["scanned"] >= self.settings.page_rows:
                    s.covered = max(s.covered, scan.position)
                else:
                    s.covered = max(s.covered, (upto, 0))
        except Unauthorized:
            # "No longer registered" (see distribute): the stream stays unsynced and tries
            # again after the next poll, which re-registers its key or, for a key revoked
            # meanwhile, answers it gone and ends the stream.
            self._force_refresh = True
        except Exception:
            logger.exception("stream backfill failed; the client resumes on reconnect")
            s.finish(_RECONNECT)
        finally:
            s.backfilling = False

    async def aclose(self) -> None:
        for streams in list(self.by_user.values()):
            for s in list(streams):
                s.close()
        if self._releasing is not None:
            with contextlib.suppress(Exception):
                await self._releasing
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


# -- request handling shared by both fronts -------------------------------------------------

@dataclass
class Opened:
    stream: Stream
    route: str


async def open_stream(hub: StreamHub, request: Request) -> Opened:
    """Check a stream request and open it, or raise the error its answer carries."""
    raw = parse_stream_path(request.path)
    if raw is False:
        raise NotFound("no such route")
    route = "/jobs/stream" if raw == "" else "/jobs/{id}/stream"
    if request.method not in ("GET", "HEAD"):
        raise MethodNotAllowed(f"{request.method} is not allowed here; allowed: GET",
                               headers={"Allow": "GET"})
    key_hash = authenticate(request)
    job_id = None if raw == "" else job_id_param(request, str(raw))
    last_event_id = request.headers.get("last-event-id")
    if last_event_id is not None:
        last_event_id = last_event_id.strip() or None
    stream = await hub.open(key_hash, job_id, last_event_id, request.user)
    return Opened(stream, route)


def _log(request: Request, route: str, status: int, started: float, frames: int = 0) -> None:
    if access_log.isEnabledFor(logging.INFO):
        access_log.info(json.dumps({
            "fn": "jobs-api", "method": request.method, "route": route, "status": status,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "user": request.user, "job_id": request.job_id, "frames": frames}))


def _error(request: Request, exc: BaseException) -> Response:
    if not isinstance(exc, SftqError):
        logger.error("stream request failed", exc_info=exc)
    elif exc.status >= 500 and exc.code == "internal":
        logger.error("stream request failed: %s", exc.message, exc_info=exc)
    return error_response(exc)


class StreamApp:
    """The ASGI application: the two stream routes (anything else answers 404)."""

    def __init__(self, hub_factory: Callable[[], StreamHub]) -> None:
        self._factory = hub_factory
        self._hub: StreamHub | None = None

    @property
    def hub(self) -> StreamHub:
        if self._hub is None:
            self._hub = self._factory()
        return self._hub

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any],
                       send: Callable[[dict[str, Any]], Any]) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        headers = Headers((k.decode("latin-1"), v.decode("latin-1"))
                          for k, v in scope.get("headers", ()))
        request = Request(scope.get("method", "GET"), scope.get("path", ""), headers=headers,
                          query_string=scope.get("query_string", b"").decode("latin-1"))
        try:
            opened = await open_stream(self.hub, request)
        except Exception as exc:
            response = _error(request, exc)
            route = "-" if parse_stream_path(request.path) is False else request.path
            _log(request, route, response.status, started)
            length = ("Content-Length", str(len(response.body)))
            await send({"type": "http.response.start", "status": response.status,
                        "headers": [(k.encode(), v.encode())
                                    for k, v in [*response.headers, length]]})
            await send({"type": "http.response.body", "body": response.body})
            return
        stream = opened.stream
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(k.encode(), v.encode()) for k, v in STREAM_HEADERS]})

        async def watch_disconnect() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    stream.close()
                    return

        watcher = asyncio.get_running_loop().create_task(watch_disconnect())
        try:
            if request.method == "HEAD":
                stream.close()
            async for chunk in stream.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except OSError:
            pass
        finally:
            stream.close()
            watcher.cancel()
            _log(request, opened.route, 200, started, stream.frames_sent)

    async def _lifespan(self, receive: Callable[[], Any],
                        send: Callable[[dict[str, Any]], Any]) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._hub is not None:
                    await self._hub.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


class WsgiStreams:
    """The stream routes for a WSGI server: the hub lives in an event loop on its own thread;
    each open stream holds one server thread, which waits on that loop (never on the
    database). For `sftq dev` and tests; production serves streams from StreamApp."""

    def __init__(self, hub_factory: Callable[[], StreamHub]) -> None:
        self._factory = hub_factory
        self._hub: StreamHub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _start(self) -> tuple[asyncio.AbstractEventLoop, StreamHub]:
        with self._lock:
            if self._loop is None or self._hub is None:
                loop = asyncio.new_event_loop()
                # The hub's database reads and stream leases run on a few named threads: a
                # fixed bound, however many streams are open.
                loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
                    max_workers=IO_THREADS, thread_name_prefix="sftq-stream-io"))
                thread = threading.Thread(target=loop.run_forever, name="sftq-stream-loop",
                                          daemon=True)
                thread.start()
                self._hub = self._factory()
                self._loop, self._thread = loop, thread
            return self._loop, self._hub

    @property
    def hub(self) -> StreamHub | None:
        return self._hub

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        loop, _ = self._start()
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        started = time.perf_counter()
        request = Request.from_environ(environ)
        request.path = (environ.get("SCRIPT_NAME", "") or "") + request.path
        loop, hub = self._start()
        try:
            opened: Opened = asyncio.run_coroutine_threadsafe(open_stream(hub, request),
                                                              loop).result()
        except Exception as exc:
            response = _error(request, exc)
            _log(request, request.path, response.status, started)
            start_response(status_line(response.status),
                           [*response.headers, ("Content-Length", str(len(response.body)))])
            return [response.body]
        start_response(status_line(200), list(STREAM_HEADERS))
        return _WsgiBody(loop, opened, request, started)

    def close(self) -> None:
        with self._lock:
            loop, hub, thread = self._loop, self._hub, self._thread
            self._loop = self._hub = self._thread = None
        if loop is None:
            return
        if hub is not None:
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(hub.aclose(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(5)
        if loop.is_running():
            return  # a stuck callback: leave the daemon thread its loop rather than break it
        # As asyncio.run ends: a server thread's body.close() may race this shutdown and start
        # a task at any moment up to here, so cancel and await tasks until none is left (a task
        # that never ran would otherwise leave its coroutine un-awaited), then close the loop,
        # which drops any callback still queued before it made its coroutine.
        _cancel_tasks(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        _cancel_tasks(loop)
        loop.close()


def _cancel_tasks(loop: asyncio.AbstractEventLoop) -> None:
    while tasks := [t for t in asyncio.all_tasks(loop) if not t.done()]:
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def _in_loop(loop: asyncio.AbstractEventLoop,
             make: Callable[[], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
    """Run make() as a task of loop, from another thread. Unlike run_coroutine_threadsafe, the
    coroutine is made inside the loop: if the loop stops before it gets to the callback, no
    coroutine exists to be left un-awaited (a warning, an error under pytest). A loop already
    closed raises RuntimeError."""
    result: concurrent.futures.Future[T] = concurrent.futures.Future()

    def start() -> None:
        task = loop.create_task(make())

        def done(t: asyncio.Task[T]) -> None:
            if t.cancelled():
                result.cancel()
            elif (exc := t.exception()) is not None:
                result.set_exception(exc)
            else:
                result.set_result(t.result())

        task.add_done_callback(done)

    loop.call_soon_threadsafe(start)
    return result


class _WsgiBody(Iterator[bytes]):
    def __init__(self, loop: asyncio.AbstractEventLoop, opened: Opened, request: Request,
                 started: float) -> None:
        self._loop = loop
        self._opened = opened
        self._request = request
        self._started = started
        self._chunks = opened.stream.chunks()
        self._closed = False
        if request.method == "HEAD":
            loop.call_soon_threadsafe(opened.stream.close)

    def __iter__(self) -> _WsgiBody:
        return self

    def __next__(self) -> bytes:
        if self._closed:
            raise StopIteration
        async def step() -> bytes:
            return await self._chunks.__anext__()

        try:
            future = _in_loop(self._loop, step)
        except RuntimeError:  # the gateway closed its loop: it is shutting down
            raise StopIteration from None
        try:
            return future.result()
        except (StopAsyncIteration, concurrent.futures.CancelledError):
            raise StopIteration from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        stream = self._opened.stream

        async def finish() -> None:
            stream.close()
            await self._chunks.aclose()

        # A task that starts but does not finish before the gateway stops its loop is
        # cancelled and awaited by WsgiStreams.close.
        if self._loop.is_running():
            with contextlib.suppress(concurrent.futures.TimeoutError,
                                     concurrent.futures.CancelledError, RuntimeError):
                _in_loop(self._loop, finish).result(5)
        _log(self._request, self._opened.route, 200, self._started, stream.frames_sent)


def make_hub(settings: Any, *, db: dbmod.Database | None = None,
             stream_settings: StreamSettings | None = None) -> StreamHub:
    """A hub on the process's shared pool for settings.database_url."""
    if db is None:
        if not settings.database_url:
            raise Unavailable("no database URL: set DATABASE_URL")
        db = dbmod.get_database(settings.database_url, max_size=settings.db_pool_max,
                                timeout=settings.db_timeout_seconds)
    return StreamHub(db, stream_settings or settings.stream)
