"""The Dockerfile, without a Docker engine: read statically (what it installs, copies, and
runs, and that its command is the setup docs/performance.md recommends), then its command run
here as it would run in the image (granian, PYTHONPATH=functions) against a migrated database."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest
from infra_support import ROOT, SETTINGS, Runner, Served, cancel, sse_frames, user_key_and_job

from sftq_server.dev.pgcluster import free_port

DOCKERFILE = ROOT / "Dockerfile"
TICK_SECRET = "container-tick-secret-0123456789abcdef"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def cmd() -> list[str]:
    found = [args for word, args in instructions() if word == "CMD"]
    assert len(found) == 1
    value = json.loads(found[0])  # exec form: no shell between Cloud Run's signals and granian
    assert isinstance(value, list)
    return [str(v) for v in value]


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_image_runs_the_recommended_server() -> None:
    argv = cmd()
    assert argv[0] == "granian"
    assert option(argv, "--interface") == "rsgi"
    assert argv[-1] == "sftq_server.http.gateway_rsgi:create_app" and "--factory" in argv
    assert option(argv, "--host") == "0.0.0.0"
    # docs/performance.md names the recommended layout ("granian --interface rsgi --workers N
    # ..."): the image runs exactly that.
    doc = (ROOT / "docs" / "performance.md").read_text()
    recommended = re.search(r"`granian --interface (\w+) --workers (\d+)", doc)
    assert recommended is not None, "docs/performance.md no longer names its recommendation"
    assert (option(argv, "--interface"), option(argv, "--workers")) == recommended.groups()
    port = option(argv, "--port")
    assert ("EXPOSE", port) in instructions()


def test_the_image_is_built_from_the_right_things() -> None:
    steps = instructions()
    assert steps[0] == ("FROM", "python:3.11-slim")  # the runtime the functions are tested on
    copies = [args for word, args in steps if word == "COPY"]
    assert "functions/ functions/" in copies and "docs/openapi.json docs/openapi.json" in copies
    assert not any(c.split()[0] in (".", "sql", "sql/", "tests", "tests/") for c in copies)
    env = " ".join(args for word, args in steps if word == "ENV")
    assert "PYTHONPATH=/app/functions" in env
    users = [args for word, args in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    install = next(args for word, args in steps if word == "RUN" and "pip install" in args)
    assert "-c constraints.txt" in install  # deploy.sh pins what was tested
    wanted = dict(re.findall(r'"([a-z][a-z0-9_-]*(?:\[[a-z]+\])?)(>=[0-9.]+)"', install))
    # Every package the functions import, with the floors pyproject.toml states.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["server"] + \
        project["optional-dependencies"]["bench"]
    floors = dict(re.match(r"([a-z][a-z0-9_-]*(?:\[[a-z]+\])?)(.*)", d).groups()  # type: ignore[union-attr]
                  for d in declared if not d.startswith("finetune-queue"))
    for package in ("psycopg[binary]", "psycopg-pool", "pydantic", "httpx", "werkzeug", "granian",
                    "uvicorn", "cryptography"):
        assert wanted.get(package) == floors[package], package
    # Bytecode is built in the image, after the sources are copied in: with
    # PYTHONDONTWRITEBYTECODE set, every cold start would compile them again.
    copy_at = steps.index(("COPY", "functions/ functions/"))
    assert any(word == "RUN" and "compileall" in args and "functions/" in args
               for word, args in steps[copy_at + 1:]), "the image does not compile functions/"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests", "**/__pycache__"} <= set(ignored)
    assert "functions" not in ignored and "docs" not in ignored


@pytest.fixture
def granian_cmd() -> list[str]:
    binary = Path(sys.executable).parent / "granian"
    if not binary.exists():
        pytest.fail("granian is not installed beside this Python (it is in the dev extra)")
    argv = cmd()
    argv[0] = str(binary)
    argv[argv.index("--host") + 1] = "127.0.0.1"
    return argv


def _start(argv: list[str], port: int, env: dict[str, str],
           output: int | IO[bytes] = subprocess.PIPE) -> subprocess.Popen[bytes]:
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    full = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT / "functions"),
            "PYTHONDONTWRITEBYTECODE": "1",
            # (the suite's placeholder payloads: tests/conftest.py)
            "SFTQ_PREFLIGHT": os.environ.get("SFTQ_PREFLIGHT", "on"), **env}
    return subprocess.Popen(argv, cwd=ROOT, env=full, stdout=output,
                            stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture
def served(granian_cmd: list[str], db_url: str) -> Iterator[str]:
    port = free_port()
    proc = _start(granian_cmd, port, {"DATABASE_URL": db_url, "SFTQ_TICK_SECRET": TICK_SECRET,
                                      "FIREWORKS_API_KEY": "fw-fake", "FIREWORKS_ACCOUNT_ID": "a",
                                      "FIREWORKS_BASE_URL": "http://127.0.0.1:9"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/functions/v1/jobs-api/health", timeout=2).status_code:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "granian did not answer"
            time.sleep(0.2)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_command_serves_the_three_functions(served: str) -> None:
    health = httpx.get(f"{served}/functions/v1/jobs-api/health", timeout=10)
    assert health.status_code == 200 and health.json()["database"] == "ok"
    assert httpx.get(f"{served}/functions/v1/analytics/health", timeout=10).status_code == 200
    assert httpx.get(f"{served}/functions/v1/jobs-api/openapi.json", timeout=10).status_code == 200
    denied = httpx.post(f"{served}/functions/v1/scheduler-tick", timeout=10,
                        headers={"Authorization": "Bearer wrong"})
    assert denied.status_code == 401 and denied.json()["code"] == "unauthorized"


def test_the_command_serves_post_jobs_and_bridges_the_rest(served: str, db_url: str) -> None:
    """The image's server answers POST /jobs on its event loop and every other route through
    the WSGI gateway: the same answers as the WSGI app gives (tests/functions)."""
    import psycopg

    uid, key, _ = user_key_and_job(db_url)
    auth = {"Authorization": f"Bearer {key}"}
    base = f"{served}/functions/v1/jobs-api"
    body = {"kind": "SFT", "gpu_count": 2, "fireworks_payload": {"dataset": "d"}}
    with httpx.Client(timeout=10) as client:
        first = client.post(f"{base}/jobs", json=body, headers={**auth, "Idempotency-Key": "k-1"})
        assert first.status_code == 201, first.text
        job = first.json()
        assert first.headers["location"] == f"/functions/v1/jobs-api/jobs/{job['id']}"
        assert first.headers.get_list("content-length") == [str(len(first.content))]
        again = client.post(f"{base}/jobs", json=body, headers={**auth, "Idempotency-Key": "k-1"})
        assert again.status_code == 201 and again.json()["id"] == job["id"]
        assert again.headers["idempotent-replayed"] == "true"
        reused = client.post(f"{base}/jobs", json={**body, "gpu_count": 3},
                             headers={**auth, "Idempotency-Key": "k-1"})
        assert reused.status_code == 409 and reused.json()["code"] == "idempotency_conflict"
        # A body sent in chunks (no Content-Length) is read too.
        chunked = client.post(f"{base}/jobs", headers={**auth, "Content-Type": "application/json"},
                              content=iter([b'{"kind": "DPO", ', b'"fireworks_payload": {}}']))
        assert chunked.status_code == 201 and chunked.json()["kind"] == "DPO"

        # The caller's mistakes, as the WSGI gateway answers them.
        def error(resp: httpx.Response, status: int, code: str) -> None:
            assert (resp.status_code, resp.json()["code"]) == (status, code), resp.text

        error(client.post(f"{base}/jobs", json=body), 401, "unauthorized")
        assert client.post(f"{base}/jobs", json=body).headers["www-authenticate"] == "Bearer"
        error(client.post(f"{base}/jobs", content=b"{}", headers=auth), 415,
              "unsupported_media_type")
        error(client.post(f"{base}/jobs", json={"kind": "XYZ", "fireworks_payload": {}},
                          headers=auth), 400, "validation_error")
        big = b'{"kind": "SFT", "fireworks_payload": {"x": "' + b"x" * 1_100_000 + b'"}}'
        error(client.post(f"{base}/jobs", content=big,
                          headers={**auth, "Content-Type": "application/json"}), 413,
              "payload_too_large")
        error(client.post(f"{base}/jobs", content=iter([big[:600_000], big[600_000:]]),
                          headers={**auth, "Content-Type": "application/json"}), 413,
              "payload_too_large")
        error(client.put(f"{base}/jobs", json=body, headers=auth), 405, "method_not_allowed")

        # Enqueues that arrive together: each its own answer and its own place in the order.
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda i: client.post(
                f"{base}/jobs", headers={**auth, "Idempotency-Key": f"burst-{i}"},
                json={**body, "display_name": f"burst-{i}"}), range(48)))
        assert [a.status_code for a in answers] == [201] * 48
        assert len({a.json()["id"] for a in answers}) == 48

        # A list longer than one page of the database is streamed by the bridge, whole.
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb, NULL, 1) "
                         "FROM generate_series(1, 2100)", (uid,))
        with client.stream("GET", f"{base}/jobs", headers=auth) as listing:
            assert listing.status_code == 200
            assert "content-length" not in listing.headers  # sent page by page
            jobs = json.loads(listing.read())
        # user_key_and_job's job, the first, the chunked one, the burst and the 2,100.
        assert len(jobs) == 1 + 1 + 1 + 48 + 2100
        assert len({j["id"] for j in jobs}) == len(jobs)
        got = client.get(f"{base}/jobs/{job['id']}", headers=auth)
        assert got.status_code == 200 and got.json()["display_name"] is None
        page = client.get(f"{base}/jobs", params={"limit": 2, "state": "QUEUED"}, headers=auth)
        assert page.headers["link"].startswith("</functions/v1/jobs-api/jobs?limit=2&state=QUEUED")


def test_the_command_writes_the_access_log(granian_cmd: list[str], db_url: str,
                                          tmp_path: Path) -> None:
    """docs/api.md: one JSON line per request on the sftq.access log. Under the image's own
    command nobody else sets logging up, so the app must, and a line still buffered when the
    service is stopped comes out."""
    port = free_port()
    workers = int(granian_cmd[granian_cmd.index("--workers") + 1])
    out_path = tmp_path / "granian.out"
    with out_path.open("wb") as out_file:
        proc = _start(granian_cmd, port, {"DATABASE_URL": db_url,
                                          "SFTQ_TICK_SECRET": TICK_SECRET}, out_file)
    try:
        # Every worker up first: a worker that gets SIGTERM while it starts never stops.
        deadline = time.monotonic() + 30
        # "Started worker-N" once per worker; under RSGI each also logs "Started worker-N
        # runtime-M", which must not be taken for another worker.
        while len(re.findall(rb"Started worker-\d+\n", out_path.read_bytes())) < workers:
            assert proc.poll() is None, out_path.read_text()
            assert time.monotonic() < deadline, out_path.read_text()
            time.sleep(0.1)
        r = httpx.get(f"http://127.0.0.1:{port}/functions/v1/jobs-api/jobs/nope", timeout=10,
                      headers={"Authorization": "Bearer sk_not_a_key"})
        assert r.status_code == 401
        os.killpg(proc.pid, signal.SIGTERM)  # at once: the line is still in its buffer
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = out_path.read_text()
    lines = [json.loads(x) for x in out.splitlines() if x.startswith('{"fn"')]
    assert [(x["route"], x["status"]) for x in lines] == [("/jobs/{id}", 401)], out
    assert "sk_not_a_key" not in out


def test_the_command_refuses_to_start_with_a_short_tick_secret(granian_cmd: list[str],
                                                               db_url: str) -> None:
    proc = _start(granian_cmd, free_port(), {"DATABASE_URL": db_url,
                                             "SFTQ_TICK_SECRET": "short-secret-0123456789"})
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert b"at least 32" in out and b"short-secret-0123456789" not in out, out[-2000:]


def test_the_documented_docker_command_matches(granian_cmd: list[str]) -> None:
    """docs/operations.md shows the image's command; it must be the Dockerfile's."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    shown = " ".join(shlex.quote(a) for a in cmd())
    assert shown in doc, shown


# ---- the two services that run a command of their own (infra/deploy.sh services) ------------

def service_argv(deploy: Runner, tmp_path: Path, name: str, port: int) -> list[str]:
    """The server command deploy.sh gives Cloud Run for service `name` (--command, --args), as
    it runs in the image, with this environment's binary and a loopback address and port."""
    env = SETTINGS | {"SFTQ_BUILD_DIR": str(tmp_path / "build"), "SFTQ_IMAGE_TAG": "t"}
    r = deploy("--dry-run", "services", "--only", name, env=env)
    assert r.code == 0, r.stderr
    (line,) = [x for x in r.lines if x.startswith(f"gcloud run deploy sftq-{name} ")]
    words = shlex.split(line)
    command = next(w for w in words if w.startswith("--command="))[len("--command="):]
    argv = [command, *next(w for w in words if w.startswith("--args="))[len("--args="):].split(",")]
    binary = Path(sys.executable).parent / command
    assert binary.exists(), f"{command} is not installed beside this Python"
    argv[0] = str(binary)
    assert option(argv, "--host") == "0.0.0.0" and option(argv, "--port") == "8080"
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(port)
    return argv


def test_the_stream_service_streams_and_stops_within_cloud_runs_grace(
        deploy: Runner, tmp_path: Path, db_url: str) -> None:
    port = free_port()
    argv = service_argv(deploy, tmp_path, "jobs-stream", port)
    assert Path(argv[0]).name == "uvicorn" and "jobs_stream:asgi_app" in argv
    user, key, job = user_key_and_job(db_url)
    server = Served(argv, port, {"PYTHONPATH": str(ROOT / "functions"), "DATABASE_URL": db_url,
                                 "SFTQ_STREAM_POLL_MS": "100",
                                 "SFTQ_STREAM_HEARTBEAT_SECONDS": "1"})
    auth = {"Authorization": f"Bearer {key}"}
    try:
        # The Edge proxy forwards the path below jobs-api; the function's own path works too.
        for base in (server.url, f"{server.url}/functions/v1/jobs-api"):
            denied = httpx.get(f"{base}/jobs/{job}/stream", timeout=10,
                               headers={"Authorization": "Bearer nope"})
            assert denied.status_code == 401 and denied.json()["code"] == "unauthorized"
        with httpx.stream("GET", f"{server.url}/jobs/{job}/stream", headers=auth,
                          timeout=httpx.Timeout(20.0)) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            live = sse_frames(resp)
            assert (next(live).data["state"]) == "QUEUED"
            cancel(db_url, user, job)
            rest = [(f.event, f.data.get("state")) for f in live]
        assert rest == [("status", "CANCELLED"), ("end", None)]

        # SIGTERM (Cloud Run gives 10 s) with a stream open: it closes and the server exits.
        with httpx.stream("GET", f"{server.url}/jobs/stream", headers=auth,
                          timeout=httpx.Timeout(20.0)) as resp:
            assert resp.status_code == 200
            closed = threading.Event()

            def drain() -> None:
                with contextlib.suppress(httpx.HTTPError):
                    for _ in resp.iter_raw():
                        pass
                closed.set()

            threading.Thread(target=drain, daemon=True).start()
            took = server.stop()
            assert closed.wait(5), "the open stream was not closed"
        assert took < 10, f"{took:.1f} s to stop: Cloud Run kills at 10 s"
    finally:
        server.stop()
    assert b"Traceback" not in server.output, server.output.decode()


def test_the_delivery_service_checks_the_tick_token(deploy: Runner, tmp_path: Path,
                                                    db_url: str) -> None:
    from sftq_server.scheduler.http import tick_token

    port = free_port()
    argv = service_argv(deploy, tmp_path, "webhook-deliver", port)
    assert Path(argv[0]).name == "granian" and "webhook_deliver:create_app" in argv
    env = {"PYTHONPATH": str(ROOT / "functions"), "DATABASE_URL": db_url,
           "SFTQ_TICK_SECRET": TICK_SECRET, "SFTQ_WEBHOOKS_KEY": "k" * 44}
    server = Served(argv, port, env)
    try:
        # pg_cron's token (what cron/schedule_webhooks.sql sends), and the secret itself.
        for bearer in (tick_token(TICK_SECRET), TICK_SECRET):
            ran = httpx.post(server.url, headers={"Authorization": f"Bearer {bearer}"},
                             timeout=30)
            assert ran.status_code == 200, ran.text
            assert ran.json()["attempts"] == 0
        for bearer in ("wrong", tick_token(TICK_SECRET, time.time() - 600)):
            refused = httpx.post(server.url, headers={"Authorization": f"Bearer {bearer}"},
                                 timeout=10)
            assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
        assert httpx.get(server.url, timeout=10).status_code == 405
    finally:
        server.stop()
    # As scheduler-tick does, it refuses to start with a short secret.
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=60, check=False,
                          env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8",
                               **env, "SFTQ_TICK_SECRET": "short-secret-0123456789"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert b"at least 32" in out and b"short-secret-0123456789" not in out, out[-2000:]
