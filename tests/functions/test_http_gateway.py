"""The gateway's prefix dispatch, the scheduler-tick mount, and the functions-framework entry
points (which must build their handler lazily and import little at load)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import types
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fn_support import Api, Db, FakeProvider, assert_error
from werkzeug.test import Client

from sftq_server import db as dbmod
from sftq_server.core.settings import Settings, get_settings
from sftq_server.http.gateway import make_gateway, make_server

ROOT = Path(__file__).resolve().parents[2]
JOBS = "/functions/v1/jobs-api"
ANALYTICS = "/functions/v1/analytics"


@pytest.fixture
def gw(gateway: Any) -> Api:
    return Api(Client(gateway))


def test_jobs_api_is_served_under_its_prefix(gw: Api, alice: str) -> None:
    resp = gw.post(f"{JOBS}/jobs", alice, json={"kind": "SFT", "fireworks_payload": {}})
    assert resp.status_code == 201
    job_id = resp.json["id"]  # type: ignore[index]
    assert resp.headers["Location"] == f"{JOBS}/jobs/{job_id}"
    assert gw.get(f"{JOBS}/jobs/{job_id}", alice).json["id"] == job_id  # type: ignore[index]
    assert gw.get(f"{JOBS}/jobs/analytics/summary", alice).json["total"] == 1  # type: ignore[index]
    assert gw.get(f"{JOBS}/health").status_code == 200
    assert gw.get(f"{JOBS}/openapi.json").status_code == 200


def test_paging_links_carry_the_prefix(gw: Api, alice: str) -> None:
    for _ in range(3):
        gw.post(f"{JOBS}/jobs", alice, json={"kind": "SFT", "fireworks_payload": {}})
    resp = gw.get(f"{JOBS}/jobs?limit=2&state=QUEUED", alice)
    cursor = resp.headers["X-Next-Cursor"]
    assert resp.headers["Link"] == f'<{JOBS}/jobs?limit=2&state=QUEUED&cursor={cursor}>; rel="next"'
    nxt = gw.get(f"{JOBS}/jobs?limit=2&state=QUEUED&cursor={cursor}", alice)
    assert len(nxt.json) == 1  # type: ignore[arg-type]


def test_analytics_is_served_under_its_prefix(gw: Api, alice: str) -> None:
    assert gw.get(f"{ANALYTICS}/jobs/analytics/queue", alice).status_code == 200
    assert gw.get(f"{ANALYTICS}/jobs/analytics/summary", alice).status_code == 200
    assert gw.get(f"{ANALYTICS}/health").status_code == 200
    assert_error(gw.get(f"{ANALYTICS}/jobs", alice), 404, "not_found")


@pytest.fixture(scope="module")
def dbless_gw() -> Iterator[Api]:
    """A gateway whose database is never reached: routing answers before any query."""
    gateway = make_gateway(Settings(database_url="postgresql://unused.invalid/none"))
    try:
        yield Api(Client(gateway))
    finally:
        gateway.close()


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
@pytest.mark.parametrize("path", [JOBS, f"{JOBS}/", ANALYTICS, "/functions/v1/jobs-apix/jobs",
                                  "/functions/v1", "/", "/jobs", "/functions/v1/other/jobs"])
def test_bare_prefixes_and_unknown_paths_are_404_never_a_redirect(dbless_gw: Api, method: str,
                                                                  path: str) -> None:
    resp = dbless_gw.request(method, path, key="sftq_" + "0" * 48,
                             json={"kind": "SFT", "fireworks_payload": {}})
    assert_error(resp, 404, "not_found")
    assert "Location" not in resp.headers


def test_scheduler_tick_without_its_module_is_a_503(settings: Settings,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The import fails as "missing".
    monkeypatch.setitem(sys.modules, "sftq_server.scheduler.http", None)
    gateway = make_gateway(settings)
    try:
        resp = Client(gateway).post("/functions/v1/scheduler-tick")
        assert_error(resp, 503, "unavailable")  # type: ignore[arg-type]
        assert resp.headers["Retry-After"] == "30"
    finally:
        gateway.close()


def test_scheduler_tick_mounts_make_tick_app(settings: Settings,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str, Settings]] = []
    module = types.ModuleType("sftq_server.scheduler.http")

    def make_tick_app(cfg: Settings) -> Any:
        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            seen.append((environ["SCRIPT_NAME"], environ["PATH_INFO"], cfg))
            start_response("200 OK", [("Content-Type", "application/json")])
            return [b'{"ticked": true}']
        return app

    module.make_tick_app = make_tick_app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sftq_server.scheduler.http", module)
    gateway = make_gateway(settings)
    try:
        client = Client(gateway)
        resp = client.post("/functions/v1/scheduler-tick")
        assert resp.status_code == 200 and resp.json == {"ticked": True}
        client.post("/functions/v1/scheduler-tick/")
        assert seen == [("/functions/v1/scheduler-tick", "", settings),
                        ("/functions/v1/scheduler-tick", "/", settings)]
    finally:
        gateway.close()


def test_make_server_serves_on_loopback_and_stops(settings: Settings, alice: str) -> None:
    server = make_server("127.0.0.1", 0, settings, provider_factory=FakeProvider)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.port}{JOBS}"
        req = urllib.request.Request(f"{base}/jobs/analytics/summary",
                                     headers={"Authorization": f"Bearer {alice}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()
        server.app.close()
    assert not thread.is_alive()


# --- functions-framework entry points -------------------------------------------------------

@pytest.fixture
def ff_env(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.delenv("ANALYTICS_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    try:
        yield db_url
    finally:
        get_settings.cache_clear()
        dbmod.get_database(db_url).close()


def test_functions_framework_serves_jobs_api(ff_env: str, alice: str, db: Db) -> None:
    import functions_framework

    app = functions_framework.create_app(target="jobs_api",
                                         source=str(ROOT / "functions" / "jobs_api.py"))
    client = app.test_client()
    headers = {"Authorization": f"Bearer {alice}"}
    assert client.get("/health").status_code == 200
    resp = client.post("/jobs", json={"kind": "DPO", "fireworks_payload": {"dataset": "d"}},
                       headers={**headers, "Idempotency-Key": "ff-1"})
    assert resp.status_code == 201, resp.get_data(as_text=True)
    assert resp.content_type == "application/json"
    job_id = resp.get_json()["id"]
    assert resp.headers["Location"] == f"/jobs/{job_id}"
    again = client.post("/jobs", json={"kind": "DPO", "fireworks_payload": {"dataset": "d"}},
                        headers={**headers, "Idempotency-Key": "ff-1"})
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert client.get(f"/jobs/{job_id}", headers=headers).get_json()["kind"] == "DPO"
    assert client.get("/jobs?kind=DPO", headers=headers).get_json()[0]["id"] == job_id
    assert client.get("/jobs/analytics/queue", headers=headers).status_code == 200
    resp = client.put("/jobs", headers=headers)
    assert resp.status_code == 405 and resp.headers["Allow"] == "GET, POST"
    resp = client.get("/jobs")
    assert resp.status_code == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
    assert client.post("/jobs", data="{", headers={**headers, "Content-Type": "application/json"}
                       ).get_json()["code"] == "invalid_json"
    assert client.delete(f"/jobs/{job_id}", headers=headers).get_json()["state"] == "CANCELLED"


def test_functions_framework_serves_analytics(ff_env: str, alice: str) -> None:
    import functions_framework

    app = functions_framework.create_app(target="analytics",
                                         source=str(ROOT / "functions" / "analytics_api.py"))
    client = app.test_client()
    headers = {"Authorization": f"Bearer {alice}"}
    assert client.get("/jobs/analytics/summary", headers=headers).get_json()["total"] == 0
    assert client.get("/health").status_code == 200
    assert client.get("/jobs", headers=headers).status_code == 404


def test_functions_framework_writes_the_access_log(db_url: str) -> None:
    """docs/api.md's access log under `functions-framework --target jobs_api` itself, which
    sets no logging up: the entry module must, or every request would go unrecorded."""
    import time

    from sftq_server.dev.pgcluster import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFTQ_")}
    env |= {"PYTHONPATH": str(ROOT / "functions"), "DATABASE_URL": db_url}
    cmd = [sys.executable, "-m", "functions_framework", "--source",
           str(ROOT / "functions" / "jobs_api.py"), "--target", "jobs_api",
           "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/jobs/nope",
                                             headers={"Authorization": "Bearer sk_not_a_key"})
                urllib.request.urlopen(req, timeout=5)
            except urllib.error.HTTPError as exc:
                assert exc.code == 401
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGTERM)  # at once: the line may still be in its buffer
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = [json.loads(x) for x in out.decode().splitlines() if x.startswith('{"fn"')]
    assert [(x["fn"], x["route"], x["status"]) for x in lines] == [
        ("jobs-api", "/jobs/{id}", 401)], out.decode()
    assert b"sk_not_a_key" not in out


def test_entry_points_import_little_at_load() -> None:
    code = (
        "import sys\n"
        "import jobs_api, analytics_api\n"
        "heavy = [m for m in ('sftq_server.http.routes.jobs', 'sftq_server.db', 'pydantic',"
        " 'psycopg', 'psycopg_pool', 'httpx', 'flask') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
        "assert callable(jobs_api.jobs_api) and callable(analytics_api.analytics)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "functions")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT / "functions", timeout=60, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_cleanly_on_a_signal(sig: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "functions"), "PYTHONUNBUFFERED": "1",
           # Never reached: the pools open on the first query, and this test sends none.
           "DATABASE_URL": "postgresql://unused.invalid/none"}
    proc = subprocess.Popen([sys.executable, "-m", "sftq_server.http.gateway", "--port", "0"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("gateway listening on http://127.0.0.1:"), first
        port = int(first.rsplit(":", 1)[1])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/functions/v1/nope", timeout=10) as r:
            raise AssertionError(f"expected 404, got {r.status}")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
    finally:
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.strip().endswith("gateway stopped")


def test_the_production_gateway_answers_501_on_the_stream_paths(
        settings: Settings, alice: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """create_app() (granian in the container) sends streams to the jobs-stream service: a
    stream here would hold one of its few WSGI threads for up to an hour, so clients are told
    to poll; `sftq dev` and `sftq serve` (make_server) keep serving streams live."""
    from sftq_server.http.gateway import create_app

    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    monkeypatch.setenv("SFTQ_TICK_SECRET", "s" * 40)
    get_settings.cache_clear()
    app = create_app()
    try:
        gw = Api(Client(app))
        job = gw.post(f"{JOBS}/jobs", alice, json={"kind": "SFT", "fireworks_payload": {}})
        assert job.status_code == 201
        for path in ("/jobs/stream", f"/jobs/{job.json['id']}/stream"):  # type: ignore[index]
            assert_error(gw.get(f"{JOBS}{path}", alice), 501, "stream_unavailable")
    finally:
        app.close()
        get_settings.cache_clear()
