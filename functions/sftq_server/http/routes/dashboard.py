"""The web dashboard (issue 14): its static files, and the read-only routes it needs beyond the
others.

The dashboard is a static page (functions/sftq_server/dashboard/: HTML, CSS and JavaScript
modules, no build step) that talks to the public API like any client, with the key the person
pastes into it. jobs-api serves it at GET /dashboard and its files at GET /dashboard/{name}, each
with a strict Content-Security-Policy: only this origin's scripts, styles, images and fetches, no
inline script, no framing. The files are read once per process and answered from memory.

The four routes it needs beyond the others are public and bounded like every route (one
procedure call each, sql/procedures/150_dashboard.sql):
    GET /queue                     the head of the queue, other users' jobs anonymised
    GET /jobs/{id}/payload         one of your jobs' payloads, secrets redacted in the database
    GET /jobs/analytics/history    your waits and run times over time, success by kind
    GET /capacity/history          GPUs in use over the last 24 hours or 7 days
"""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path
from typing import Final

from sftq_server import db as dbmod
from sftq_server.core.errors import BadRequest, NotFound
from sftq_server.core.settings import Settings
from sftq_server.http.checks import authenticate, check_query, job_id_param, limit_param, one_row
from sftq_server.http.web import JSON_HEADERS, Request, Response

STATIC_DIR: Final = Path(__file__).resolve().parents[2] / "dashboard"

CONTENT_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}
# Everything the page loads comes from this origin; nothing runs inline (every script is a file,
# styles are files), and no other site may frame it. connect-src 'self' is the API itself.
CSP: Final = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
              "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
              "form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS: Final[tuple[tuple[str, str], ...]] = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Permissions-Policy", "camera=(), microphone=(), geolocation=(), payment=()"),
)
_ASSET_RE: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}\.(?:html|js|css|svg|txt)")

QUEUE_DEFAULT_LIMIT: Final = 20
QUEUE_MAX_LIMIT: Final = 50
HISTORY_DEFAULT_DAYS: Final = 30
HISTORY_MAX_DAYS: Final = 90
GPU_WINDOWS: Final = ("24h", "7d")
_DAYS_RE: Final = re.compile(r"[0-9]{1,3}")


class _Asset:
    __slots__ = ("body", "content_type", "etag")

    def __init__(self, body: bytes, content_type: str) -> None:
        self.body = body
        self.content_type = content_type
        self.etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


class StaticFiles:
    """The dashboard's files, read on first use and kept in memory (they are small: a test keeps
    them under 300 KiB together)."""

    def __init__(self, root: Path = STATIC_DIR) -> None:
        self.root = root
        self._assets: dict[str, _Asset] | None = None
        self._lock = threading.Lock()

    def assets(self) -> dict[str, _Asset]:
        if self._assets is None:
            with self._lock:
                if self._assets is None:
                    found: dict[str, _Asset] = {}
                    if self.root.is_dir():
                        for path in sorted(self.root.iterdir()):
                            if path.is_file() and _ASSET_RE.fullmatch(path.name):
                                found[path.name] = _Asset(path.read_bytes(),
                                                          CONTENT_TYPES[path.suffix])
                    self._assets = found
        return self._assets

    def get(self, name: str) -> _Asset | None:
        if not _ASSET_RE.fullmatch(name):
            return None
        return self.assets().get(name)


def _static_response(request: Request, asset: _Asset) -> Response:
    headers = [("Content-Type", asset.content_type), ("ETag", asset.etag),
               # Revalidated on every load (a 304 costs nothing): a new deployment is seen at once.
               ("Cache-Control", "no-cache"), *SECURITY_HEADERS]
    match = request.headers.get("if-none-match")
    if match and asset.etag in (tag.strip() for tag in match.split(",")):
        return Response(304, b"", headers)
    return Response(200, asset.body, headers)


class DashboardApi:
    """The dashboard's page, files and read-only routes."""

    def __init__(self, settings: Settings, db: dbmod.Database,
                 static: StaticFiles | None = None) -> None:
        self.settings = settings
        self.db = db
        self.static = static or StaticFiles()

    # GET /dashboard
    def page(self, request: Request) -> Response:
        if request.path.endswith("/"):
            # /dashboard/ would resolve the page's relative links one folder too deep.
            return Response(308, b"", [("Location", "../dashboard"), ("Cache-Control", "no-cache"),
                                       *SECURITY_HEADERS])
        # A page, not an API route: a query string (a bookmark's, a tracker's) is ignored.
        asset = self.static.get("index.html")
        if asset is None:
            raise NotFound("the dashboard is not deployed with this function")
        return _static_response(request, asset)

    # GET /dashboard/{name}
    def asset(self, request: Request, name: str) -> Response:
        asset = self.static.get(name)
        if asset is None or name == "index.html":
            raise NotFound("no such dashboard file")
        return _static_response(request, asset)

    # GET /queue
    def queue(self, request: Request) -> Response:
        key_hash = authenticate(request)
        query = check_query(request, frozenset({"limit"}))
        limit = limit_param(query, QUEUE_DEFAULT_LIMIT, QUEUE_MAX_LIMIT)
        s = self.settings
        body = one_row(self.db.fetchone(dbmod.API_PUBLIC_QUEUE, (
            key_hash, limit, s.tick_interval_seconds, s.usage_grace_seconds)))[0]
        return Response(200, body.encode(), [*JSON_HEADERS, ("Cache-Control", "no-store")])

    # GET /jobs/{id}/payload
    def payload(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        job_id = job_id_param(request, raw_id)
        check_query(request, frozenset())
        body = one_row(self.db.fetchone(dbmod.API_JOB_PAYLOAD, (key_hash, job_id)))[0]
        return Response(200, body.encode(), [*JSON_HEADERS, ("Cache-Control", "no-store")])

    # GET /jobs/analytics/history
    def history(self, request: Request) -> Response:
        key_hash = authenticate(request)
        query = check_query(request, frozenset({"days"}))
        days = HISTORY_DEFAULT_DAYS
        raw = query.get("days")
        if raw is not None:
            if not _DAYS_RE.fullmatch(raw) or not 1 <= int(raw) <= HISTORY_MAX_DAYS:
                raise BadRequest(f"days must be an integer from 1 to {HISTORY_MAX_DAYS}")
            days = int(raw)
        body = one_row(self.db.fetchone(dbmod.API_JOB_HISTORY, (key_hash, days)))[0]
        return Response(200, body.encode(), [*JSON_HEADERS, ("Cache-Control", "no-store")])

    # GET /capacity/history
    def gpu_history(self, request: Request) -> Response:
        key_hash = authenticate(request)
        query = check_query(request, frozenset({"window"}))
        window = query.get("window", GPU_WINDOWS[0])
        if window not in GPU_WINDOWS:
            raise BadRequest("window must be one of " + ", ".join(GPU_WINDOWS))
        body = one_row(self.db.fetchone(dbmod.API_GPU_HISTORY, (key_hash, window)))[0]
        return Response(200, body.encode(), [*JSON_HEADERS, ("Cache-Control", "no-store")])
