"""GET /jobs/{id}/events: one job's history, oldest first, in pages of `limit` after an event id.

The procedure (sftq.api_job_events) answers the body: each event with a sentence for a person
computed from its type and detail, and the detail with secrets redacted.
"""

from __future__ import annotations

import re

from sftq_server import db as dbmod
from sftq_server.core.errors import BadRequest
from sftq_server.http.checks import authenticate, check_query, job_id_param, limit_param, one_row
from sftq_server.http.web import JSON_HEADERS, Request, Response

DEFAULT_EVENTS_LIMIT = 50
MAX_EVENTS_LIMIT = 100
_EVENT_PARAMS = frozenset({"limit", "after"})
# Event ids are bigint identities; 18 digits stay inside bigint.
_AFTER_RE = re.compile(r"[0-9]{1,18}")


class EventsApi:
    def __init__(self, db: dbmod.Database) -> None:
        self.db = db

    # GET /jobs/{id}/events
    def list_events(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        job_id = job_id_param(request, raw_id)
        query = check_query(request, _EVENT_PARAMS)
        limit = limit_param(query, DEFAULT_EVENTS_LIMIT, MAX_EVENTS_LIMIT)
        raw_after = query.get("after")
        after = None
        if raw_after is not None:
            if not _AFTER_RE.fullmatch(raw_after):
                raise BadRequest("after must be the id of an event (a whole number)")
            after = int(raw_after)
        body = one_row(self.db.fetchone(dbmod.API_JOB_EVENTS,
                                           (key_hash, job_id, limit, after)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))
