"""jobs-api serves the dashboard: the page and its files with a strict Content-Security-Policy, and
the dashboard's routes (GET /queue, /jobs/{id}/payload, /jobs/analytics/history,
/capacity/history) with the documented shapes, checks and errors."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dash_support import PAYLOAD, SECRETS, Api, Q, envelope
from jsonschema import Draft202012Validator
from werkzeug.test import Client, TestResponse

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.http.apps import ApiApp, make_jobs_api
from sftq_server.http.routes.dashboard import CSP, STATIC_DIR
from sftq_server.http.web import wsgi_app

SPEC: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text())
BUDGET = 300 * 1024


@pytest.fixture
def app(db_url: str) -> Iterator[ApiApp]:
    settings = Settings(database_url=db_url, db_timeout_seconds=2.0)
    database = Database(db_url, max_size=2, timeout=2.0)
    application = make_jobs_api(settings, db=database)
    try:
        yield application
    finally:
        application.close()


@pytest.fixture
def client(app: ApiApp) -> Client:
    return Client(wsgi_app(app))


@pytest.fixture
def q(conn: psycopg.Connection[Any]) -> Q:
    return Q(conn)


@pytest.fixture
def users(q: Q) -> dict[str, str]:
    for name in ("dash-alice", "dash-bob"):
        q.user(name)
    return {"alice": q.key("dash-alice"), "bob": q.key("dash-bob")}


def conforms(resp: TestResponse, method: str, template: str) -> None:
    """The answer is one docs/openapi.json gives for this operation, body and all."""
    op = SPEC["paths"][template][method.lower()]
    documented = op["responses"][str(resp.status_code)]
    while "$ref" in documented:
        documented = SPEC["components"]["responses"][documented["$ref"].rsplit("/", 1)[-1]]
    content = documented.get("content", {})
    ctype = (resp.content_type or "").split(";")[0]
    assert ctype in content, (template, resp.status_code, ctype)
    if ctype == "application/json":
        schema = {**content[ctype]["schema"], "components": SPEC["components"]}
        Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER).validate(
            resp.get_json())


def refused(resp: TestResponse, status: int, code: str, template: str) -> None:
    """An error in the envelope, and one the document gives for this operation."""
    envelope(resp, status, code)
    conforms(resp, "GET", template)


# --- the page and its files ------------------------------------------------------------------

def security_headers_ok(resp: TestResponse) -> None:
    csp = resp.headers["Content-Security-Policy"]
    assert csp == CSP
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in csp and "data:" not in csp and "*" not in csp
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["X-Frame-Options"] == "DENY"
    assert resp.headers["Referrer-Policy"] == "no-referrer"


def test_the_page_is_served_with_a_strict_policy(client: Client) -> None:
    resp = client.get("/dashboard")
    assert resp.status_code == 200
    assert resp.content_type == "text/html; charset=utf-8"
    security_headers_ok(resp)
    conforms(resp, "GET", "/dashboard")
    assert b"dashboard/app.js" in resp.data
    # The public path works too (a platform that forwards the whole path), and a query string
    # (a bookmark's) is ignored.
    full = client.get("/functions/v1/jobs-api/dashboard?utm_source=x")
    assert full.status_code == 200 and full.data == resp.data
    # /dashboard/ would resolve relative links one folder too deep: redirected, relatively.
    slash = client.get("/dashboard/")
    assert slash.status_code == 308 and slash.headers["Location"] == "../dashboard"


def test_files_have_types_etags_and_the_same_policy(client: Client) -> None:
    for name, ctype in (("app.js", "text/javascript; charset=utf-8"),
                        ("style.css", "text/css; charset=utf-8"),
                        ("icon.svg", "image/svg+xml")):
        resp = client.get(f"/dashboard/{name}")
        assert resp.status_code == 200, name
        assert resp.content_type == ctype
        assert resp.data == (STATIC_DIR / name).read_bytes()
        security_headers_ok(resp)
        assert resp.headers["Cache-Control"] == "no-cache"
        again = client.get(f"/dashboard/{name}", headers={"If-None-Match": resp.headers["ETag"]})
        assert again.status_code == 304 and again.data == b""
        conforms(resp, "GET", "/dashboard/{name}")


@pytest.mark.parametrize("name", ["nope.js", "index.html", "..%2fapi.py", "app.js.map",
                                  "APP.JS", ".hidden.js", "app.py", "%2e%2e"])
def test_anything_else_under_the_prefix_is_a_404(client: Client, name: str) -> None:
    resp = client.get(f"/dashboard/{name}")
    envelope(resp, 404, "not_found")


def test_the_whole_dashboard_is_under_300_kib_and_loads_nothing_from_elsewhere() -> None:
    files = sorted(p for p in STATIC_DIR.iterdir() if p.is_file())
    total = sum(p.stat().st_size for p in files)
    assert total < BUDGET, f"{total} bytes"
    # No absolute URL anywhere (the SVG namespace names no resource).
    for path in files:
        text = path.read_text(encoding="utf-8").replace("http://www.w3.org/2000/svg", "")
        assert not re.search(r"(?i)\b(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text), path.name
        if path.suffix == ".css":
            assert "@import" not in text and "url(" not in text, path.name


class _Html(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self.scripts: list[dict[str, str | None]] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {k for k, _ in attrs}
        if tag == "script":
            self.scripts.append(dict(attrs))
            self._in_script = True
        if tag == "style" or "style" in names:
            self.problems.append(f"inline style on <{tag}>")
        self.problems += [f"{k} on <{tag}>" for k in names if k.startswith("on")]

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.problems.append("inline script")


def test_no_inline_script_or_style_and_no_html_built_from_strings() -> None:
    page = _Html()
    page.feed((STATIC_DIR / "index.html").read_text())
    assert page.problems == []
    assert page.scripts and all(s.get("src") and s.get("type") == "module" for s in page.scripts)
    for path in STATIC_DIR.glob("*.js"):
        # The code without its comments (which may name what it avoids).
        code = re.sub(r"(?m)^\s*//.*$|/\*.*?\*/", "", path.read_text(), flags=re.S)
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                     "new Function", "setAttribute(\"style\"", "localStorage", "document.cookie"):
            assert sink not in code, f"{path.name} uses {sink}"
    api_js = (STATIC_DIR / "api.js").read_text()
    # The key: sessionStorage only, and sent in the Authorization header, without cookies.
    assert "sessionStorage" in api_js and 'credentials: "omit"' in api_js
    assert "Authorization: `Bearer ${this.key}`" in api_js


# --- GET /queue --------------------------------------------------------------------------------

def test_queue_route(client: Client, q: Q, users: dict[str, str]) -> None:
    api = Api(client, users["alice"])
    alice = int(q.one("SELECT id FROM sftq.users WHERE name = 'dash-alice'"))
    bob = int(q.one("SELECT id FROM sftq.users WHERE name = 'dash-bob'"))
    theirs = q.enqueue(bob, name="bob's secret project", payload=PAYLOAD)
    mine = q.enqueue(alice, name="<img src=x onerror=alert(1)>")
    q.tick(datetime.now(UTC))
    resp = api.get("/queue")
    assert resp.status_code == 200 and resp.headers["Cache-Control"] == "no-store"
    conforms(resp, "GET", "/queue")
    body = resp.get_json()
    assert body["limit"] == 20 and body["depth"] == 2 and body["your_queued_jobs"] == 1
    first, second = body["items"]
    assert (first["position"], first["mine"], first["id"], first["display_name"]) == (
        1, False, None, None)
    assert (second["mine"], second["id"], second["display_name"]) == (
        True, str(mine), "<img src=x onerror=alert(1)>")
    text = resp.get_data(as_text=True)
    for leak in (str(theirs), "bob", "dash-bob", *SECRETS):
        assert leak not in text
    assert len(api.get("/queue?limit=1").get_json()["items"]) == 1
    for bad in ("0", "51", "x", "1.5", ""):
        refused(api.get(f"/queue?limit={bad}"), 400, "validation_error", "/queue")
    refused(api.get("/queue?limit=2&limit=3"), 400, "validation_error", "/queue")
    refused(api.get("/queue?user=dash-bob"), 400, "validation_error", "/queue")
    refused(api.get("/queue", key="sftq_" + "0" * 48), 401, "unauthorized", "/queue")
    refused(client.get("/queue"), 401, "unauthorized", "/queue")


# --- GET /jobs/{id}/payload ----------------------------------------------------------------------

def test_payload_route_redacts_and_is_owner_scoped(client: Client, q: Q,
                                                   users: dict[str, str]) -> None:
    alice = Api(client, users["alice"])
    resp = alice.post("/jobs", {"kind": "SFT", "fireworks_payload": PAYLOAD})
    job = resp.get_json()["id"]
    got = alice.get(f"/jobs/{job}/payload")
    assert got.status_code == 200
    conforms(got, "GET", "/jobs/{id}/payload")
    body = got.get_json()
    assert body["id"] == job
    assert body["fireworks_payload"]["wandbConfig"]["apiKey"] == "[REDACTED]"
    assert body["fireworks_payload"]["baseModel"] == PAYLOAD["baseModel"]
    for secret in SECRETS:
        assert secret not in got.get_data(as_text=True)
    # Another user's job, an unknown one and a malformed id are all the same 404.
    for key, target in ((users["bob"], job), (users["alice"], str(uuid.uuid4())),
                        (users["alice"], "not-a-uuid")):
        refused(alice.get(f"/jobs/{target}/payload", key=key), 404, "not_found",
                "/jobs/{id}/payload")
    refused(client.get(f"/jobs/{job}/payload"), 401, "unauthorized", "/jobs/{id}/payload")
    envelope(alice.get(f"/jobs/{job}/payload?x=1"), 400, "validation_error")


# --- the chart series -----------------------------------------------------------------------------


def test_payload_route_shows_token_counts(client: Client, users: dict[str, str]) -> None:
    """maxOutputTokens is a count, not a secret: the RFT example reads as Fireworks received it."""
    alice = Api(client, users["alice"])
    root = Path(__file__).resolve().parents[2]
    example = json.loads((root / "examples" / "rft.json").read_text())
    example["wandbConfig"] = {"apiKey": SECRETS[0]}
    resp = alice.post("/jobs", {"kind": "RFT", "fireworks_payload": example})
    assert resp.status_code == 201, resp.get_data(as_text=True)
    body = alice.get(f"/jobs/{resp.get_json()['id']}/payload").get_json()
    assert body["fireworks_payload"]["inferenceParameters"]["maxOutputTokens"] == 1024
    assert body["fireworks_payload"]["wandbConfig"] == {"apiKey": "[REDACTED]"}

def test_history_route(client: Client, q: Q, users: dict[str, str]) -> None:
    api = Api(client, users["alice"])
    for kind in ("SFT", "DPO"):
        assert api.post("/jobs", {"kind": kind, "fireworks_payload": {}}).status_code == 201
    resp = api.get("/jobs/analytics/history")
    assert resp.status_code == 200
    conforms(resp, "GET", "/jobs/analytics/history")
    body = resp.get_json()
    assert body["days"] == 30 and body["jobs"] == 2 and len(body["buckets"]) == 31
    assert {k["kind"]: k["open"] for k in body["by_kind"]} == {"SFT": 1, "DPO": 1, "RFT": 0}
    short = api.get("/jobs/analytics/history?days=2").get_json()
    assert short["bucket_seconds"] == 3600 and len(short["buckets"]) == 49
    assert api.get("/jobs/analytics/history?days=90").status_code == 200
    for bad in ("0", "91", "-1", "x", "1000"):
        refused(api.get(f"/jobs/analytics/history?days={bad}"), 400, "validation_error",
                "/jobs/analytics/history")
    # Bob has no jobs: his history is empty, alice's are not counted for him.
    assert api.get("/jobs/analytics/history", key=users["bob"]).get_json()["jobs"] == 0
    envelope(client.get("/jobs/analytics/history"), 401, "unauthorized")


def test_gpu_history_route(client: Client, q: Q, users: dict[str, str]) -> None:
    api = Api(client, users["bob"])
    now = datetime.now(UTC)
    q.tick(now - timedelta(minutes=20), limit=16, usage=4, ours=4)
    q.tick(now - timedelta(minutes=1), limit=16, usage=8, ours=8)
    resp = api.get("/capacity/history")
    assert resp.status_code == 200
    conforms(resp, "GET", "/capacity/history")
    points = resp.get_json()["points"]
    assert len(points) == 96
    assert (points[-1]["quota_limit"], points[-1]["quota_usage"], points[-1]["queue_gpus"]) == (
        16, 8, 8)
    assert points[-2]["quota_usage"] == 4
    week = api.get("/capacity/history?window=7d").get_json()
    assert len(week["points"]) == 168 and week["step_seconds"] == 3600
    for bad in ("1h", "30d", "", "24H"):
        refused(api.get(f"/capacity/history?window={bad}"), 400, "validation_error",
                "/capacity/history")
    envelope(client.get("/capacity/history"), 401, "unauthorized")


def test_routes_are_documented(app: ApiApp) -> None:
    served = {r.template for r in app.router.routes}
    for path in ("/dashboard", "/dashboard/{name}", "/queue", "/jobs/{id}/payload",
                 "/jobs/analytics/history", "/capacity/history"):
        assert path in served and path in SPEC["paths"], path
