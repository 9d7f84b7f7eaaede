"""The RSGI gateway (sftq_server.http.gateway_rsgi), driven in-process with a stand-in for granian's
protocol object: POST /jobs answers exactly as the WSGI gateway does, every other request is
bridged to the WSGI gateway faithfully, and the event-loop group commit keeps each request's
own answer. tests/infra/test_container.py runs the same app under the real granian."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fn_support import SFT_PAYLOAD, Db, FakeProvider
from werkzeug.test import Client

from sftq_server.core.errors import BadRequest, SftqError, Unavailable
from sftq_server.core.settings import Settings
from sftq_server.http.gateway import JOBS_PREFIX, make_gateway
from sftq_server.http.gateway_rsgi import RsgiGateway, WsgiBridge
from sftq_server.http.group_commit import AsyncGroupCommit, Params

# ---- a stand-in for granian's RSGI scope and protocol ------------------------------------


class Scope:
    proto = "http"
    http_version = "1.1"
    scheme = "http"
    server = "127.0.0.1:8080"
    client = "127.0.0.1:50000"
    authority = None

    def __init__(self, method: str, path: str, headers: list[tuple[str, str]],
                 query_string: str = "") -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self._headers = [(k.lower(), v) for k, v in headers]

    @property
    def headers(self) -> Any:
        items = self._headers

        class Headers:
            def items(self) -> list[tuple[str, str]]:
                return list(items)

        return Headers()


class Transport:
    def __init__(self, proto: Proto) -> None:
        self._proto = proto

    async def send_bytes(self, data: bytes) -> None:
        if self._proto.fail_after is not None and len(self._proto.chunks) >= self._proto.fail_after:
            raise RuntimeError("client disconnected")  # what granian's ProtocolClosed is
        self._proto.chunks.append(data)


class Proto:
    """Records the answer; hands out the body chunk by chunk, counting what was read."""

    def __init__(self, body: list[bytes] | None = None, fail_after: int | None = None) -> None:
        self._body = list(body or [])
        self.read = 0  # chunks handed out
        self.status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.body = b""
        self.chunks: list[bytes] = []
        self.streamed = False
        self.fail_after = fail_after

    async def __call__(self) -> bytes:
        data = b"".join(self._body[self.read:])
        self.read = len(self._body)
        return data

    def __aiter__(self) -> Any:
        async def chunks() -> Any:
            while self.read < len(self._body):
                self.read += 1
                yield self._body[self.read - 1]

        return chunks()

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        assert self.status is None, "answered twice"
        self.status, self.headers, self.body = status, headers, body

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> Transport:
        assert self.status is None, "answered twice"
        self.status, self.headers, self.streamed = status, headers, True
        return Transport(self)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.body)


def request(app: Any, method: str, path: str, *, headers: dict[str, str] | None = None,
            body: bytes | list[bytes] = b"", chunked: bool = False,
            query_string: str = "") -> Proto:
    chunks = body if isinstance(body, list) else ([body] if body else [])
    pairs = list((headers or {}).items())
    if not chunked and chunks and not any(k.lower() == "content-length" for k, _ in pairs):
        pairs.append(("content-length", str(sum(map(len, chunks)))))
    proto = Proto(chunks)
    asyncio.run(rsgi_of(app)(Scope(method, path, pairs, query_string), proto))
    return proto


def rsgi_of(app: Any) -> Any:
    """What granian calls: an app's __rsgi__, or the app itself."""
    return getattr(app, "__rsgi__", app)


# ---- the gateway on a real database --------------------------------------------------------

@pytest.fixture
def rsgi(settings: Settings, provider: FakeProvider) -> Iterator[RsgiGateway]:
    app = RsgiGateway(make_gateway(settings, provider_factory=lambda: provider), threads=4)
    loop = asyncio.new_event_loop()  # what granian passes; the app does not keep it
    app.__rsgi_init__(loop)
    try:
        yield app
    finally:
        app.__rsgi_del__(loop)
        loop.close()


def post_jobs(key: str | None, body: Any, **headers: str) -> dict[str, Any]:
    hdrs = {"Content-Type": "application/json", **headers}
    if key is not None:
        hdrs["Authorization"] = f"Bearer {key}"
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return {"headers": hdrs, "body": raw}


GOOD = {"kind": "SFT", "display_name": "one", "gpu_count": 2, "fireworks_payload": SFT_PAYLOAD}


def submit_cases(key: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("created", post_jobs(key, GOOD)),
        ("no key", post_jobs(None, GOOD)),
        ("malformed key", post_jobs("sk-not-ours", GOOD)),
        ("unknown key", post_jobs("sftq_" + "0" * 48, GOOD)),
        ("not json", post_jobs(key, GOOD, **{"Content-Type": "text/plain"})),
        ("latin-1", post_jobs(key, GOOD, **{"Content-Type": "application/json; charset=latin-1"})),
        ("broken json", post_jobs(key, b'{"kind": ')),
        ("bad kind", post_jobs(key, {**GOOD, "kind": "PPO"})),
        ("NaN", post_jobs(key, b'{"kind": "SFT", "fireworks_payload": {"lr": NaN}}')),
        ("NUL", post_jobs(key, {**GOOD, "display_name": "a\u0000b"})),
        ("bad idempotency key", post_jobs(key, GOOD, **{"Idempotency-Key": "\x7f" * 3})),
        ("timeout out of range", post_jobs(key, {**GOOD, "queue_timeout_seconds": 0})),
        ("too many gpus", post_jobs(key, {**GOOD, "gpu_count": 10_000})),
        ("too large", post_jobs(key, b"{" + b" " * 1_048_576 + b"}")),
    ]


def test_post_jobs_answers_as_the_wsgi_gateway_does(rsgi: RsgiGateway, db: Db,
                                                    access_lines: Callable[[], list[Any]]) -> None:
    key = db.user("alice")
    wsgi = Client(rsgi.gateway)
    for name, case in submit_cases(key):
        ours = request(rsgi, "POST", f"{JOBS_PREFIX}/jobs", headers=case["headers"],
                       body=case["body"])
        theirs = wsgi.post(f"{JOBS_PREFIX}/jobs", headers=case["headers"], data=case["body"])
        assert ours.status == theirs.status_code, (name, ours.body)
        got, want = ours.json(), theirs.json
        assert isinstance(want, dict)
        if ours.status == 201:
            assert ours.header("Location") == f"{JOBS_PREFIX}/jobs/{got['id']}"
            assert got.keys() == want.keys() and got["id"] != want["id"]
            assert {k: v for k, v in got.items() if k not in ("id", "created_at")} == \
                {k: v for k, v in want.items() if k not in ("id", "created_at")}
        else:
            assert got == want, name
        assert sorted(k.lower() for k, _ in ours.headers if k.lower() != "content-length") == \
            sorted(k.lower() for k, _ in theirs.headers.items() if k.lower() != "content-length")
    lines = access_lines()
    assert len(lines) == 2 * len(submit_cases(key))
    ours_lines, theirs_lines = lines[0::2], lines[1::2]
    for a, b in zip(ours_lines, theirs_lines, strict=True):
        assert {k: v for k, v in a.items() if k not in ("duration_ms", "job_id")} == \
            {k: v for k, v in b.items() if k not in ("duration_ms", "job_id")}
        assert a["route"] == "/jobs" and a["fn"] == "jobs-api"


def test_a_too_large_body_is_refused_before_it_is_read(rsgi: RsgiGateway, db: Db) -> None:
    key = db.user("alice")
    case = post_jobs(key, GOOD)
    declared = request(rsgi, "POST", f"{JOBS_PREFIX}/jobs", body=[b"{}"] * 3,
                       headers={**case["headers"], "Content-Length": str(2 * 1_048_576)})
    assert declared.status == 413 and declared.json()["code"] == "payload_too_large"
    # Without a length: read only until it passes the limit.
    chunk = b" " * 400_000
    proto = Proto([b"{", *[chunk] * 10])
    asyncio.run(rsgi.__rsgi__(Scope("POST", f"{JOBS_PREFIX}/jobs", list(case["headers"].items())),
                              proto))
    assert proto.status == 413 and proto.read == 4
    # (granian's HTTP layer refuses a malformed Content-Length first; the app does too.)
    bad = request(rsgi, "POST", f"{JOBS_PREFIX}/jobs", body=b"{}",
                  headers={**case["headers"], "Content-Length": "x1"})
    assert bad.status == 400 and bad.json()["error"] == "Content-Length is not a valid number"


def test_a_body_in_chunks_is_put_together(rsgi: RsgiGateway, db: Db) -> None:
    key = db.user("alice")
    case = post_jobs(key, GOOD)
    raw = case["body"]
    proto = request(rsgi, "POST", f"{JOBS_PREFIX}/jobs", headers=case["headers"],
                    body=[raw[:7], raw[7:20], raw[20:]], chunked=True)
    assert proto.status == 201
    stored = db.conn.execute("SELECT display_name FROM sftq.jobs WHERE id = %s",
                             (proto.json()["id"],)).fetchone()
    assert stored == ("one",)


async def _rsgi_call(app: Any, scope: Scope, proto: Proto) -> Proto:
    await rsgi_of(app)(scope, proto)
    return proto


def test_enqueues_that_arrive_together_keep_their_own_answers(rsgi: RsgiGateway, db: Db) -> None:
    keys = [db.user(f"user{i}") for i in range(4)]

    async def burst() -> list[Proto]:
        calls = []
        for i in range(40):
            case = post_jobs(keys[i % 4], {**GOOD, "display_name": f"job-{i}"},
                             **{"Idempotency-Key": f"k{i % 20}"})
            calls.append(_rsgi_call(rsgi, Scope("POST", f"{JOBS_PREFIX}/jobs", [
                *case["headers"].items(), ("content-length", str(len(case["body"])))]),
                Proto([case["body"]])))
        return await asyncio.gather(*calls)

    answers = asyncio.run(burst())
    gc = rsgi.group_commit
    assert gc.requests == 40 and gc.batches < 40  # they did share transactions
    by_key: dict[tuple[int, int], list[Proto]] = {}
    for i, a in enumerate(answers):
        by_key.setdefault((i % 4, i % 20), []).append(a)
    for pair in by_key.values():
        first, second = pair
        # The same user and key twice: the second is the first's replay (or a conflict when
        # its body differs, as here, since the display names differ).
        assert first.status == 201, first.body
        assert second.status == 409 and second.json()["code"] == "idempotency_conflict"
    # FIFO: the stored order is the arrival order.
    stored = db.conn.execute(
        "SELECT display_name FROM sftq.jobs ORDER BY created_at, id").fetchall()
    created = [f"job-{i}" for i, a in enumerate(answers) if a.status == 201]
    assert [r[0] for r in stored] == created


# ---- the bridge ---------------------------------------------------------------------------

def bridged(app: Callable[..., Iterable[bytes]], *args: Any, threads: int = 2,
            **kwargs: Any) -> Proto:
    with ThreadPoolExecutor(threads) as pool:
        return request(WsgiBridge(app, pool), *args, **kwargs)


def test_the_bridge_gives_the_wsgi_app_a_pep3333_environ() -> None:
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        seen.update(environ)
        seen["body"] = environ["wsgi.input"].read()
        start_response("202 Accepted", [("X-A", "1")])
        return [b"ok"]

    proto = bridged(app, "PUT", "/functions/v1/caf\u00e9", query_string="a=%20b&c",
                    headers={"Content-Type": "text/plain", "X-Many": "1", "Accept": "*/*",
                             "User-Agent": "t"}, body=[b"ab", b"cd"])
    assert (proto.status, proto.body, proto.headers) == (202, b"ok", [("X-A", "1")])
    assert seen["REQUEST_METHOD"] == "PUT" and seen["SCRIPT_NAME"] == ""
    assert seen["PATH_INFO"] == "/functions/v1/caf\u00c3\u00a9"  # UTF-8 bytes as latin-1
    assert seen["QUERY_STRING"] == "a=%20b&c" and seen["CONTENT_TYPE"] == "text/plain"
    assert seen["CONTENT_LENGTH"] == "4" and seen["body"] == b"abcd"
    assert (seen["SERVER_NAME"], seen["SERVER_PORT"], seen["REMOTE_ADDR"]) == \
        ("127.0.0.1", "8080", "127.0.0.1")
    assert seen["HTTP_X_MANY"] == "1" and seen["HTTP_USER_AGENT"] == "t"
    assert seen["SERVER_PROTOCOL"] == "HTTP/1.1" and seen["wsgi.url_scheme"] == "http"

    # A repeated header reaches the app once, its values joined (as WSGI servers do).
    scope = Scope("GET", "/", [("x-many", "1"), ("x-many", "2")])
    with ThreadPoolExecutor(1) as pool:
        asyncio.run(WsgiBridge(app, pool)(scope, Proto()))
    assert seen["HTTP_X_MANY"] == "1,2"


def test_the_bridge_reads_only_what_the_app_reads() -> None:
    def reads(n: int) -> Callable[..., Iterable[bytes]]:
        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            data = environ["wsgi.input"].read(n) if n else b""
            start_response("200 OK", [])
            return [data]
        return app

    chunks = [b"a" * 10, b"b" * 10, b"c" * 10]
    for n, wanted_chunks in ((0, 0), (5, 1), (15, 2), (30, 3)):
        proto = Proto(list(chunks))
        with ThreadPoolExecutor(1) as pool:
            asyncio.run(WsgiBridge(reads(n), pool)(Scope("POST", "/", []), proto))
        assert proto.read == wanted_chunks and proto.body == b"".join(chunks)[:n]


class Streamed:
    """A streamed WSGI body that records how far it was read and whether it was closed."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.made = 0
        self.closed = 0
        self.threads: set[str] = set()

    def __iter__(self) -> Iterator[bytes]:
        while self.made < self.n:
            self.threads.add(threading.current_thread().name)
            self.made += 1
            yield f"{self.made},".encode()

    def close(self) -> None:
        self.closed += 1


def test_a_streamed_answer_is_sent_chunk_by_chunk_and_closed() -> None:
    body = Streamed(5)

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "application/json")])
        return body

    proto = bridged(app, "GET", "/")
    assert proto.streamed and proto.status == 200
    assert proto.chunks == [b"1,", b"2,", b"3,", b"4,", b"5,"] and body.closed == 1
    assert body.threads and threading.current_thread().name not in body.threads

    # The client goes away after two chunks: the body is no longer read, and is closed.
    body = Streamed(1000)
    with ThreadPoolExecutor(2) as pool:
        proto = Proto(fail_after=2)
        asyncio.run(WsgiBridge(app, pool)(Scope("GET", "/", []), proto))
    assert proto.chunks == [b"1,", b"2,"] and body.made == 3 and body.closed == 1

    # An empty streamed body: a plain empty answer.
    body = Streamed(0)
    proto = bridged(app, "GET", "/")
    assert (proto.status, proto.body, proto.streamed, body.closed) == (200, b"", False, 1)


def test_an_app_that_breaks_the_protocol_is_a_500_envelope(
        caplog: pytest.LogCaptureFixture) -> None:
    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        raise RuntimeError("boom")

    proto = bridged(app, "GET", "/")
    assert proto.status == 500 and proto.json() == {"error": "internal server error",
                                                    "code": "internal"}
    assert "boom" not in proto.body.decode()


# ---- the group commit on an event loop ------------------------------------------------------

def p(name: str) -> Params:
    return (b"k" * 32, "SFT", "{}", name, 1, None, None)


class Fake(AsyncGroupCommit):
    """Answers without a database, as sftq.api_submit_many's rows do; records the batches. A
    name starting with 'bad' is that request's own error; `gate` holds a batch until set;
    `fail` is raised by any batch of more than one request."""

    def __init__(self, max_batch: int = 64) -> None:
        super().__init__("postgresql://unused.invalid/none", max_batch=max_batch)
        self.sizes: list[int] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: Exception | None = None

    async def _call(self, items: Any) -> list[tuple[Any, ...]]:
        self.sizes.append(len(items))
        await self.gate.wait()
        if self.fail is not None and len(items) > 1:
            raise self.fail
        return [(i, "{}", False, name, "SQ400" if name.startswith("bad") else None,
                 f"{name} is bad", None) for i, (_, _, _, name, *_) in enumerate(items)]


async def submit_all(gc: AsyncGroupCommit, names: list[str]) -> list[Any]:
    return await asyncio.gather(*(gc.submit(p(n)) for n in names), return_exceptions=True)


def test_requests_of_one_moment_share_a_batch_and_keep_their_answers() -> None:
    gc = Fake()
    out = asyncio.run(submit_all(gc, ["a", "bad-b", "c"]))
    assert gc.sizes == [3] and (gc.batches, gc.requests) == (1, 3)
    assert out[0] == ("{}", False, "a") and out[2] == ("{}", False, "c")
    assert isinstance(out[1], BadRequest) and out[1].message == "bad-b is bad"


def test_arrivals_during_a_batch_form_the_next_one_bounded_by_max_batch() -> None:
    gc = Fake(max_batch=4)

    async def scenario() -> list[Any]:
        gc.gate.clear()
        first = asyncio.ensure_future(gc.submit(p("first")))
        while not gc.sizes:  # the first batch is in the database
            await asyncio.sleep(0.001)
        rest = asyncio.ensure_future(submit_all(gc, [f"r{i}" for i in range(10)]))
        await asyncio.sleep(0.05)
        gc.gate.set()
        return [await first, *await rest]

    out = asyncio.run(scenario())
    assert gc.sizes == [1, 4, 4, 2]
    assert [o[2] for o in out] == ["first", *[f"r{i}" for i in range(10)]]


def test_a_batch_waits_for_the_company_of_recent_batches_at_most_linger() -> None:
    import time

    gc = Fake()
    gc._linger = 5.0
    t0 = time.monotonic()
    asyncio.run(submit_all(gc, ["alone"]))  # only lone requests before it: sent at once
    assert gc.sizes == [1] and time.monotonic() - t0 < 1
    asyncio.run(submit_all(gc, ["a", "b", "c"]))

    async def scenario() -> None:
        first = asyncio.ensure_future(gc.submit(p("x")))
        await asyncio.sleep(0.05)
        assert gc.sizes == [1, 3]  # it waits for the company the last batches had
        await submit_all(gc, ["y", "z"])
        await first

    asyncio.run(scenario())
    assert gc.sizes == [1, 3, 3]
    gc._linger = 0.05  # but never longer than the linger
    t0 = time.monotonic()
    asyncio.run(submit_all(gc, ["late"]))
    assert gc.sizes == [1, 3, 3, 1] and 0.04 < time.monotonic() - t0 < 1


def test_a_batch_that_fails_is_retried_request_by_request() -> None:
    gc = Fake()
    gc.fail = SftqError("a surprise")
    out = asyncio.run(submit_all(gc, ["a", "bad-b", "c"]))
    assert gc.sizes == [3, 1, 1, 1]
    assert out[0][2] == "a" and out[2][2] == "c" and isinstance(out[1], BadRequest)
    # The database out of reach is everyone's answer at once: no retries.
    gc = Fake()
    gc.fail = Unavailable("down")
    out = asyncio.run(submit_all(gc, ["a", "b"]))
    assert gc.sizes == [2] and all(isinstance(o, Unavailable) for o in out)


def test_a_request_that_is_cancelled_leaves_the_others_answered() -> None:
    gc = Fake()

    async def scenario() -> list[Any]:
        gc.gate.clear()
        tasks = [asyncio.ensure_future(gc.submit(p(n))) for n in ("a", "b", "c")]
        while not gc.sizes:
            await asyncio.sleep(0.001)
        tasks[1].cancel()  # its client went away
        gc.gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    out = asyncio.run(scenario())
    assert out[0][2] == "a" and out[2][2] == "c"
    assert isinstance(out[1], asyncio.CancelledError)


def test_an_unreachable_database_is_a_503_not_a_hang() -> None:
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    gc = AsyncGroupCommit("postgresql://sftq@127.0.0.1:1/none", timeout=2.0)
    out = asyncio.run(submit_all(gc, ["a", "b"]))
    assert all(isinstance(o, Unavailable) and o.status == 503 for o in out), out
    assert out[0].headers["Retry-After"] == "5"


def test_a_broken_connection_is_replaced(db: Db, settings: Settings) -> None:
    key = db.user("alice")
    key_hash = hashlib.sha256(key.encode()).digest()
    gc = AsyncGroupCommit(settings.database_url)

    async def submit(name: str) -> Any:
        try:
            return await gc.submit((key_hash, "SFT", "{}", name, 1, None, None))
        except SftqError as exc:
            return exc

    def one(name: str) -> Any:
        return asyncio.run(submit(name))

    async def backend_pid() -> int:
        conn = await gc._connection()
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        assert row is not None
        return int(row[0])

    try:
        assert one("before")[2]
        db.conn.execute("SELECT pg_terminate_backend(%s)", (asyncio.run(backend_pid()),))
        # The batch that finds the connection gone is a 503 (it may or may not have been
        # written: the client retries with its Idempotency-Key); the next one reconnects.
        broken = one("during")
        assert isinstance(broken, Unavailable), broken
        assert one("after")[2]
    finally:
        asyncio.run(gc.close())
    names = db.conn.execute("SELECT display_name FROM sftq.jobs ORDER BY created_at").fetchall()
    assert [n[0] for n in names] == ["before", "after"]
