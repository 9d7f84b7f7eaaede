"""GET /jobs without `limit` or `cursor`: every job of the caller, newest first.

The contract promises "all of your jobs" to callers that read only the body. A heavy user has
tens of thousands, so the answer is never built whole: it is read in keyset pages of
STREAM_PAGE jobs (sftq.api_list_jobs, the same procedure as the paged form) and written page
by page as one JSON array. Each page is its own short query: no database connection is held
while the client reads, which a transaction-mode pooler and a slow client both need. Jobs
appear once each, newest first (the keyset is (created_at, id), which never changes); the
pages are not one snapshot, like pages a client would fetch itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from . import api as base
from . import db as dbmod
from .web import JSON_HEADERS, Response

logger = logging.getLogger("sftq.api")

# Jobs per page read from the database (the procedure's maximum page size).
STREAM_PAGE = 1000


def all_jobs(db: dbmod.Database, key_hash: bytes, state: str | None,
             kind: str | None) -> Response:
    """The whole list. The first page is read before answering, so a bad key or a database
    that is down is still a proper error status; most callers fit in it and get a plain body."""
    body, cursor = base._body(db.fetchone(dbmod.API_LIST_JOBS,
                                          (key_hash, state, kind, STREAM_PAGE, None)))
    if not cursor:
        return Response(200, body.encode(), list(JSON_HEADERS))
    return Response(200, headers=list(JSON_HEADERS),
                    stream=_pages(db, key_hash, state, kind, body, cursor))


def _pages(db: dbmod.Database, key_hash: bytes, state: str | None, kind: str | None,
           first: str, cursor: str | None) -> Iterator[bytes]:
    # Each page is the procedure's JSON array text: its items go out between our own
    # brackets, so nothing is parsed or re-encoded here.
    yield first[:-1].encode()
    while cursor:
        try:
            page, cursor = base._body(db.fetchone(dbmod.API_LIST_JOBS,
                                                  (key_hash, state, kind, STREAM_PAGE, cursor)))
        except Exception:
            # The status is sent already: end the response unfinished (no closing bracket,
            # no final chunk) so the client cannot mistake it for a complete list.
            logger.exception("GET /jobs: the database failed while streaming the list")
            raise
        items = page[1:-1]
        if items.strip():
            yield b", " + items.encode()
    yield b"]"
