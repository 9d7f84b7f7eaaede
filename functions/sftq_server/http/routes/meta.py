"""The routes about the service itself: GET /health (is the database there) and GET
/openapi.json (the API description from docs/, when it is deployed with the function)."""

from __future__ import annotations

from pathlib import Path

from sftq_server import db as dbmod
from sftq_server.core.errors import NotFound
from sftq_server.http.checks import one_row
from sftq_server.http.web import JSON_HEADERS, Request, Response

OPENAPI_PATH = Path(__file__).resolve().parents[4] / "docs" / "openapi.json"


class MetaApi:
    def __init__(self, db: dbmod.Database) -> None:
        self.db = db
        self._openapi: bytes | None = None

    # GET /health
    def health(self, request: Request) -> Response:
        # Bounded by the pool timeout (settings.db_timeout_seconds): a dead database is a 503
        # with Retry-After, never a hang; the pool reconnects by itself when it is back.
        body = one_row(self.db.fetchone(dbmod.API_HEALTH))[0]
        return Response(200, ('{"status": "ok", ' + body[1:]).encode(),
                        [*JSON_HEADERS, ("Cache-Control", "no-store")])

    # GET /openapi.json
    def openapi(self, request: Request) -> Response:
        if self._openapi is None:
            try:
                self._openapi = OPENAPI_PATH.read_bytes()
            except OSError:
                raise NotFound("the OpenAPI document is not deployed with this function") from None
        return Response(200, self._openapi, list(JSON_HEADERS))
