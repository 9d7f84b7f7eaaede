"""The Supabase Edge proxies (supabase/functions/*), run with Deno in front of the local
gateway: the README walkthrough and the contract's curl lines through them, verbatim but for
SUPABASE_URL; the queue's real stream through them, live, resumed with Last-Event-ID; the two
stream routes sent to the stream's own upstream (SFTQ_UPSTREAM_JOBS_STREAM) and everything
else to jobs-api's; a server-sent event stream passed through frame by frame; a body over the
limit; an upstream that is down. Deno comes from the npm package `deno` (.ci/run installs it
and sets SFTQ_DENO); under CI a missing Deno fails the test rather than skipping it.

tests/infra/edge/router.ts stands in for Supabase's own routing (/functions/v1/<name> to that
function), using the same handler each supabase/functions/<name>/index.ts serves; the entry
files themselves are also run, each alone, as Supabase runs them.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from infra_support import ROOT, Frame, sse_frames

from sftq_server.core.settings import Settings, StreamSettings
from sftq_server.dev.pgcluster import free_port
from sftq_server.http.gateway import make_server
from sftq_server.simulator import Simulator, SimulatorServer

FUNCTIONS = ("jobs-api", "analytics", "scheduler-tick", "webhook-deliver")
SECRET_NAMES = {"jobs-api": "SFTQ_UPSTREAM_JOBS_API", "analytics": "SFTQ_UPSTREAM_ANALYTICS",
                "scheduler-tick": "SFTQ_UPSTREAM_SCHEDULER_TICK",
                "webhook-deliver": "SFTQ_UPSTREAM_WEBHOOK_DELIVER"}
STREAM_SECRET = "SFTQ_UPSTREAM_JOBS_STREAM"
ROUTER = ROOT / "tests" / "infra" / "edge" / "router.ts"
TICK_SECRET = "proxy-tick-secret-0123456789abcdefghij"
ACCOUNT = "sim-account"


def deno_binary() -> str:
    for candidate in (os.environ.get("SFTQ_DENO"), shutil.which("deno"),
                      str(ROOT / "node_modules" / ".bin" / "deno")):
        if candidate and Path(candidate).exists():
            return candidate
    message = ("Deno is not installed: `npm install deno` (the npm package ships the binary) "
               "and set SFTQ_DENO to node_modules/.bin/deno; .ci/run does this")
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def deno() -> str:
    return deno_binary()


class DenoProcess:
    """`deno run` of one file on a free loopback port, until stop()."""

    def __init__(self, deno: str, script: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": os.environ.get("HOME", "/"), "DENO_NO_UPDATE_CHECK": "1",
                "NO_COLOR": "1", "SFTQ_PROXY_PORT": str(self.port),
                **env}
        if "DENO_DIR" in os.environ:
            full["DENO_DIR"] = os.environ["DENO_DIR"]
        self.proc = subprocess.Popen(
            [deno, "run", "--quiet", "--no-prompt", "--allow-net=127.0.0.1", "--allow-env",
             str(script)], env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.stop()
            raise AssertionError(f"{script.name} did not start: {line}{self.output}")
        self.url = f"http://127.0.0.1:{self.port}"
        self.output = ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.output = out or ""


def upstreams(base: str) -> dict[str, str]:
    return {SECRET_NAMES[name]: f"{base}/functions/v1/{name}" for name in FUNCTIONS}


@dataclass
class Stack:
    gateway: str
    proxy: str
    simulator: str
    key: str
    stop_gateway: Callable[[], None]
    open_streams: Callable[[], int]
    stopped: list[bool] = field(default_factory=list)


@pytest.fixture
def stack(deno: str, db_url: str) -> Iterator[Stack]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT sftq.create_user('alice', 2)")
        row = conn.execute("SELECT key FROM sftq.issue_key('alice')").fetchone()
        assert row is not None
        key = str(row[0])
    sim = SimulatorServer(Simulator(account_id=ACCOUNT, job_seconds=0, max_value=64, seed=3))
    sim.start()
    settings = Settings(database_url=db_url, tick_secret=TICK_SECRET,
                        fireworks_base_url=sim.url, fireworks_api_key="fw-proxy-test-key",
                        fireworks_account_id=ACCOUNT, fireworks_timeout_seconds=5.0,
                        # The gateway's stream hub: a quick poll, and a heartbeat each second
                        # (a stream whose client left ends at its next write).
                        stream=StreamSettings(poll_ms=100, heartbeat_seconds=1))
    server = make_server("127.0.0.1", 0, settings)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    gateway = f"http://127.0.0.1:{server.port}"
    stopped: list[bool] = []

    def stop_gateway() -> None:
        if not stopped:
            stopped.append(True)
            server.shutdown()
            server.server_close()
            server.app.close()

    def open_streams() -> int:
        # The gateway's streams (sftq_server.stream.hub.WsgiStreams), once one was opened.
        streams = server.app._streams
        hub = None if streams is None else streams.hub
        return 0 if hub is None else int(hub.open_streams)

    router = DenoProcess(deno, ROUTER, upstreams(gateway))
    try:
        yield Stack(gateway, router.url, sim.url, key, stop_gateway, open_streams, stopped)
    finally:
        router.stop()
        stop_gateway()
        sim.stop()


def bash(script: str, env: dict[str, str], cwd: Path | None = None) -> str:
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stderr == "", done.stderr
    return done.stdout


def shell_env(**values: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", **values}


# ---- the README walkthrough and the contract's lines ------------------------------------------

def test_the_readme_walkthrough_through_the_proxy(stack: Stack, tmp_path: Path) -> None:
    blocks = re.findall(r"^```bash walkthrough\n(.*?)^```$",
                        (ROOT / "README.md").read_text(encoding="utf-8"), re.S | re.M)
    assert len(blocks) >= 5
    # The env file `sftq dev` would write, naming the proxy as SUPABASE_URL.
    (tmp_path / ".sftq").mkdir()
    (tmp_path / ".sftq" / "env").write_text(
        f"SUPABASE_URL={stack.proxy}\nSIMULATOR_URL={stack.simulator}\n"
        f"SFTQ_TICK_SECRET={TICK_SECRET}\nSFTQ_API_KEY={stack.key}\n")
    out = bash("\n".join(blocks), shell_env(), cwd=tmp_path)
    job_id = re.search(r"^queued: ([0-9a-f-]{36})$", out, re.M)
    assert job_id, out
    for state in ("PROGRESS", "JOB_STATE_COMPLETED", "SUCCESS"):
        assert re.search(rf'"state"\s*:\s*"{state}"', out), out
    assert not re.search(r'"error"\s*:\s*"', out), out
    assert '"success_rate"' in out and '"global_queue_depth"' in out and '"timeline"' in out
    direct = httpx.get(f"{stack.gateway}/functions/v1/jobs-api/jobs/{job_id.group(1)}",
                       headers={"Authorization": f"Bearer {stack.key}"})
    assert direct.json()["state"] == "SUCCESS"


def contract_lines() -> Any:
    """The contract's snippets, verbatim, as tests/functions/test_http_contract.py keeps them."""
    folder = str(ROOT / "tests" / "functions")
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(
            "sftq_contract_lines", ROOT / "tests" / "functions" / "test_http_contract.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(folder)


def test_the_contract_lines_through_the_proxy_answer_as_directly(stack: Stack) -> None:
    c = contract_lines()
    via_proxy = shell_env(SUPABASE_URL=stack.proxy, SFTQ_API_KEY=stack.key)
    direct = shell_env(SUPABASE_URL=stack.gateway, SFTQ_API_KEY=stack.key)

    err = json.loads(bash(c.ENQUEUE_TEMPLATE, via_proxy))
    assert err == json.loads(bash(c.ENQUEUE_TEMPLATE, direct))
    assert err["code"] == "invalid_json"
    enqueued = bash(c.FIRE_AND_FORGET, via_proxy)
    job_id = re.fullmatch(r"enqueued: ([0-9a-f-]{36})\n", enqueued)
    assert job_id, enqueued
    for line in (c.LIST_ALL, c.LIST_PROGRESS, c.LIST_DPO, c.GET_ONE, c.QUEUE_1, c.SUMMARY_1,
                 c.JOB_ANALYTICS_1, c.QUEUE_2, c.SUMMARY_2, c.JOB_ANALYTICS_2):
        line = line.replace("<job_id>", job_id[1]).replace("<id>", job_id[1])
        assert json.loads(bash(line, via_proxy)) == json.loads(bash(line, direct)), line
    cancel = c.CANCEL.replace("<id>", job_id[1])
    cancelled = json.loads(bash(cancel, via_proxy))
    assert cancelled["state"] == "CANCELLED"
    assert json.loads(bash(cancel, via_proxy)) == json.loads(bash(cancel, direct))  # 409 alike
    assert bash(c.POLL, via_proxy | {"job_id": job_id[1]}).strip().endswith("CANCELLED")
    snippet = c.PYTHON_SNIPPET + """
job = enqueue("DPO", {"dataset": "d", "trainingConfig": {"baseModel": "m"}}, display_name="py")
assert status(job["id"])["state"] == "QUEUED"
assert any(j["id"] == job["id"] for j in list_jobs(kind="DPO"))
assert cancel(job["id"])["state"] == "CANCELLED"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", snippet], env=via_proxy, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout == "ok\n", done.stderr


def test_request_ids_and_the_tick_token_pass_through(stack: Stack) -> None:
    answer = httpx.get(f"{stack.proxy}/functions/v1/jobs-api/health",
                       headers={"X-Request-Id": "req-1234"})
    assert answer.status_code == 200 and answer.headers["x-request-id"] == "req-1234"
    made = httpx.get(f"{stack.proxy}/functions/v1/analytics/health")
    assert made.status_code == 200
    assert re.fullmatch(r"[0-9a-f-]{36}", made.headers["x-request-id"])
    # pg_cron's short-lived token reaches scheduler-tick untouched.
    seconds = str(int(time.time()))
    mac = hmac.new(TICK_SECRET.encode(), seconds.encode(), hashlib.sha256).hexdigest()
    tick = httpx.post(f"{stack.proxy}/functions/v1/scheduler-tick", timeout=30,
                      headers={"Authorization": f"Bearer v1.{seconds}.{mac}"}, json={})
    assert tick.status_code == 200 and tick.json()["status"] in ("ok", "skipped"), tick.text
    unknown = httpx.get(f"{stack.proxy}/functions/v1/nothing-here")
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"


def test_the_upstream_stopped_is_a_502_envelope(stack: Stack) -> None:
    stack.stop_gateway()
    answer = httpx.get(f"{stack.proxy}/functions/v1/jobs-api/jobs",
                       headers={"Authorization": f"Bearer {stack.key}", "X-Request-Id": "r-9"})
    assert answer.status_code == 502
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"error": answer.json()["error"], "code": "bad_gateway"}
    assert answer.headers["x-request-id"] == "r-9" and answer.headers["retry-after"] == "5"


# ---- the queue's own stream, through the proxy --------------------------------------------------

def test_a_real_stream_through_the_proxy_is_live_and_resumes(stack: Stack) -> None:
    """jobs-api's stream routes through the proxy, in front of the local gateway (which
    serves the stream; SFTQ_UPSTREAM_JOBS_STREAM unset, so jobs-api's upstream): each frame
    reaches the client while the stream is still open, and a reconnect's Last-Event-ID
    reaches the server (it resumes after that frame, and refuses an id it never sent)."""
    base = f"{stack.proxy}/functions/v1/jobs-api"
    auth = {"Authorization": f"Bearer {stack.key}"}
    job = {"kind": "SFT", "fireworks_payload": {"dataset": "d", "baseModel": "m"}}

    def enqueue(name: str) -> str:
        answer = httpx.post(f"{base}/jobs", json={**job, "display_name": name}, headers=auth)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    first = enqueue("first")
    seen: list[Frame] = []
    with httpx.stream("GET", f"{base}/jobs/stream", timeout=httpx.Timeout(20.0),
                      headers={**auth, "Accept": "text/event-stream"}) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert re.fullmatch(r"[0-9a-f-]{36}", resp.headers["x-request-id"])
        live = sse_frames(resp)
        snapshot = next(live)
        assert (snapshot.event, snapshot.data["id"], snapshot.data["state"]) == \
            ("status", first, "QUEUED")
        # Changes made now arrive on this open stream, one frame each, before it ends (the
        # all-jobs stream never ends by itself: a proxy that buffered would show nothing).
        cancelled = httpx.delete(f"{base}/jobs/{first}", headers=auth)
        assert cancelled.status_code == 200, cancelled.text
        seen.append(next(live))
        second = enqueue("second")
        seen.append(next(live))
    assert [(f.event, f.data["id"], f.data["state"]) for f in seen] == \
        [("status", first, "CANCELLED"), ("status", second, "QUEUED")]
    assert all(f.id for f in seen) and seen[0].id != seen[1].id

    # Resume after the CANCELLED frame: exactly the frame that followed it, same id, same data.
    with httpx.stream("GET", f"{base}/jobs/stream", timeout=httpx.Timeout(20.0),
                      headers={**auth, "Last-Event-ID": str(seen[0].id)}) as resp:
        assert resp.status_code == 200
        replayed = next(sse_frames(resp))
    assert (replayed.id, replayed.event, replayed.data) == (seen[1].id, seen[1].event, seen[1].data)
    # An id this stream never sent: the server's 400 comes back through the proxy.
    refused = httpx.get(f"{base}/jobs/stream",
                        headers={**auth, "Last-Event-ID": "987654321987"})
    assert refused.status_code == 400 and refused.json()["code"] == "validation_error"

    # A job's own stream ends after its terminal state, and the proxy closes with it.
    with httpx.stream("GET", f"{base}/jobs/{first}/stream", timeout=httpx.Timeout(20.0),
                      headers=auth) as resp:
        assert resp.status_code == 200
        assert [(f.event, f.data.get("state")) for f in sse_frames(resp)] == \
            [("status", "CANCELLED"), ("end", None)]
    denied = httpx.get(f"{base}/jobs/{first}/stream", headers={"Authorization": "Bearer nope"})
    assert denied.status_code == 401 and denied.json()["code"] == "unauthorized"

    # Each client that left was let go upstream too: the proxy aborts its upstream request,
    # and the gateway's stream ends at its next write (a heartbeat, every second here).
    deadline = time.monotonic() + 15
    while stack.open_streams():
        assert time.monotonic() < deadline, f"{stack.open_streams()} streams still open upstream"
        time.sleep(0.1)


# ---- a stream, and a body over the limit, against an upstream of our own -----------------------

class Upstream:
    """A small HTTP server: GET .../stream sends three SSE frames, waiting after each until the
    client says it has it (so frames reach the client before the upstream has finished);
    anything else is counted and answered 200."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.received = [threading.Event() for _ in range(3)]
        self.stalled = False
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                upstream.seen.append({"path": self.path, "headers": dict(self.headers)})
                if not self.path.endswith("/stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b"{}")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                for i, got in enumerate(upstream.received, start=1):
                    self.wfile.write(f"id: {i}\nevent: job\ndata: {{\"n\": {i}}}\n\n".encode())
                    self.wfile.flush()
                    if not got.wait(timeout=10):
                        upstream.stalled = True
                        return

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                upstream.seen.append({"path": self.path, "headers": dict(self.headers),
                                      "body": len(self.rfile.read(length))})
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"created": true}')

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for event in self.received:
            event.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def own_upstream(deno: str) -> Iterator[tuple[Upstream, str]]:
    upstream = Upstream()
    router = DenoProcess(deno, ROUTER, {name: upstream.url for name in SECRET_NAMES.values()})
    try:
        yield upstream, router.url
    finally:
        router.stop()
        upstream.close()


def test_a_stream_through_the_proxy_arrives_frame_by_frame(
        own_upstream: tuple[Upstream, str]) -> None:
    upstream, proxy = own_upstream
    frames: list[str] = []
    headers = {"Authorization": "Bearer sftq_x", "Accept": "text/event-stream",
               "Last-Event-ID": "7", "Cookie": "not=forwarded"}
    with httpx.stream("GET", f"{proxy}/functions/v1/jobs-api/jobs/abc/stream", headers=headers,
                      timeout=30) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-cache"
        frame: list[str] = []
        for line in resp.iter_lines():
            if line:
                frame.append(line)
                continue
            frames.append("\n".join(frame))
            frame = []
            # Only now may the upstream send the next frame: had the proxy held frames back
            # until the upstream finished, this would never happen and the upstream stalls.
            upstream.received[len(frames) - 1].set()
    assert not upstream.stalled
    assert frames == [f'id: {i}\nevent: job\ndata: {{"n": {i}}}' for i in (1, 2, 3)]
    seen = {k.lower(): v for k, v in upstream.seen[0]["headers"].items()}
    assert upstream.seen[0]["path"] == "/jobs/abc/stream"
    assert seen["last-event-id"] == "7" and seen["accept"] == "text/event-stream"
    assert seen["authorization"] == "Bearer sftq_x" and "cookie" not in seen
    assert re.fullmatch(r"[0-9a-f-]{36}", seen["x-request-id"])


@pytest.fixture
def two_upstreams(deno: str) -> Iterator[tuple[Upstream, Upstream, str]]:
    """jobs-api (and the others) on one upstream, the stream routes on another."""
    api, streams = Upstream(), Upstream()
    env = {name: api.url for name in SECRET_NAMES.values()} | {STREAM_SECRET: streams.url}
    router = DenoProcess(deno, ROUTER, env)
    try:
        yield api, streams, router.url
    finally:
        router.stop()
        api.close()
        streams.close()


def test_the_stream_routes_go_to_the_stream_upstream(
        two_upstreams: tuple[Upstream, Upstream, str]) -> None:
    api, streams, proxy = two_upstreams
    for upstream in (api, streams):
        for got in upstream.received:
            got.set()  # no need to pace these streams
    to_stream = ["/jobs/stream", "/jobs/stream/",
                 "/jobs/6f1c1f9e-0000-4000-8000-000000000001/stream", "/jobs/stream?x=1"]
    to_api = ["/jobs", "/jobs/abc", "/jobs/abc/events", "/jobs/stream/extra", "/jobs//stream",
              "/stream", "/jobs/a/b/stream"]
    for path in to_stream + to_api:
        answer = httpx.get(f"{proxy}/functions/v1/jobs-api{path}",
                           headers={"Last-Event-ID": "41", "Authorization": "Bearer sftq_x"})
        assert answer.status_code == 200, (path, answer.text)
    assert [s["path"] for s in streams.seen] == to_stream
    assert [s["path"] for s in api.seen] == to_api
    stream_headers = {k.lower(): v for k, v in streams.seen[0]["headers"].items()}
    assert stream_headers["last-event-id"] == "41"
    assert stream_headers["authorization"] == "Bearer sftq_x"
    # Only GET (and HEAD) of those paths stream; a POST there is jobs-api's to answer.
    posted = httpx.post(f"{proxy}/functions/v1/jobs-api/jobs/stream", content=b"{}")
    assert posted.status_code == 201 and api.seen[-1]["path"] == "/jobs/stream"
    # Other functions never stream, whatever their path: analytics keeps its upstream.
    httpx.get(f"{proxy}/functions/v1/analytics/jobs/stream")
    assert len(streams.seen) == len(to_stream) and api.seen[-1]["path"] == "/jobs/stream"
    # webhook-deliver forwards pg_net's POST, token and all.
    fired = httpx.post(f"{proxy}/functions/v1/webhook-deliver", content=b"{}",
                       headers={"Authorization": "Bearer v1.1700000000." + "a" * 64,
                                "Content-Type": "application/json"})
    assert fired.status_code == 201 and api.seen[-1]["path"] == "/"
    forwarded = {k.lower(): v for k, v in api.seen[-1]["headers"].items()}
    assert forwarded["authorization"] == "Bearer v1.1700000000." + "a" * 64


def test_a_body_over_the_limit_never_reaches_the_function(
        own_upstream: tuple[Upstream, str]) -> None:
    upstream, proxy = own_upstream
    url = f"{proxy}/functions/v1/jobs-api/jobs?x=1"
    ok = httpx.post(url, content=b"x" * 1_048_576, headers={"Idempotency-Key": "k-1",
                                                           "Content-Type": "application/json"})
    assert ok.status_code == 201 and ok.json() == {"created": True}
    assert upstream.seen[-1]["body"] == 1_048_576 and upstream.seen[-1]["path"] == "/jobs?x=1"
    forwarded = {k.lower(): v for k, v in upstream.seen[-1]["headers"].items()}
    assert forwarded["idempotency-key"] == "k-1"
    calls = len(upstream.seen)
    for body in (b"x" * (1_048_576 + 1), iter([b"x" * 700_000, b"x" * 700_000])):
        over = httpx.post(url, content=body, headers={"Content-Type": "application/json"})
        assert over.status_code == 413
        assert over.json() == {"error": "request body is larger than 1048576 bytes",
                               "code": "payload_too_large"}
    assert len(upstream.seen) == calls


# ---- the entry files, as Supabase runs them --------------------------------------------------

def test_each_entry_file_serves_its_function_through_the_shared_module(
        stack: Stack, deno: str) -> None:
    shared = ROOT / "supabase" / "functions" / "_shared" / "sftq_proxy.ts"
    for name in FUNCTIONS:
        entry = ROOT / "supabase" / "functions" / name / "index.ts"
        text = entry.read_text()
        assert '"../_shared/sftq_proxy.ts"' in text and f'serve("{name}")' in text
        assert len(text.splitlines()) < 10, "an entry file only names its function"
    assert "fetch(" in shared.read_text()
    config = tomllib.loads((ROOT / "supabase" / "config.toml").read_text())
    assert {name: config["functions"][name]["verify_jwt"] for name in FUNCTIONS} == \
        dict.fromkeys(FUNCTIONS, False)
    checked = subprocess.run([deno, "check", "--quiet",
                              *(str(ROOT / "supabase" / "functions" / n / "index.ts")
                                for n in FUNCTIONS), str(ROUTER)],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"})
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # Supabase hands a function the path /<name>/...: run scheduler-tick and jobs-api alone.
    tick = DenoProcess(deno, ROOT / "supabase" / "functions" / "scheduler-tick" / "index.ts",
                       upstreams(stack.gateway))
    jobs = DenoProcess(deno, ROOT / "supabase" / "functions" / "jobs-api" / "index.ts",
                       upstreams(stack.gateway))
    try:
        fired = httpx.post(f"{tick.url}/scheduler-tick", timeout=30,
                           headers={"Authorization": f"Bearer {TICK_SECRET}"})
        assert fired.status_code == 200 and fired.json()["status"] in ("ok", "skipped")
        listed = httpx.get(f"{jobs.url}/jobs-api/jobs",
                           headers={"Authorization": f"Bearer {stack.key}"})
        assert listed.status_code == 200 and listed.json() == []
        other = httpx.get(f"{jobs.url}/analytics/health")
        assert other.status_code == 404
    finally:
        tick.stop()
        jobs.stop()


def test_an_unconfigured_proxy_says_which_secret_is_missing(deno: str) -> None:
    alone = DenoProcess(deno, ROOT / "supabase" / "functions" / "analytics" / "index.ts", {})
    try:
        answer = httpx.get(f"{alone.url}/analytics/health")
        assert answer.status_code == 503
        assert answer.json()["code"] == "not_configured"
        assert "SFTQ_UPSTREAM_ANALYTICS" in answer.json()["error"]
    finally:
        alone.stop()
