"""GET /capacity: the GPU quota as last read, what runs and waits, per user, and whether the
scheduler is running. Any valid key may ask; SFTQ_CAPACITY_SHOW_USERS=false folds every user
but the caller into one "others" row."""

from __future__ import annotations

from sftq_server import db as dbmod
from sftq_server.core.settings import Settings
from sftq_server.http.checks import authenticate, check_query, one_row
from sftq_server.http.web import JSON_HEADERS, Request, Response


class CapacityApi:
    def __init__(self, settings: Settings, db: dbmod.Database) -> None:
        self.settings = settings
        self.db = db

    # GET /capacity
    def capacity(self, request: Request) -> Response:
        key_hash = authenticate(request)
        check_query(request, frozenset())
        s = self.settings
        body = one_row(self.db.fetchone(dbmod.API_CAPACITY, (
            key_hash, s.capacity_show_users, s.tick_interval_seconds, s.usage_grace_seconds,
            s.fireworks_quota_id)))[0]
        return Response(200, body.encode(), [*JSON_HEADERS, ("Cache-Control", "no-store")])
