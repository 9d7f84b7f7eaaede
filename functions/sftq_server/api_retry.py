"""POST /jobs/{id}/retry: a FAIL or CANCELLED job enqueued again as a new job (issue 10).

One procedure call (sftq.api_retry_job), like every jobs-api route: it authenticates, checks
the job is the caller's and has ended badly, and answers the enqueue shape plus retry_of.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import db as dbmod
from .web import JSON_HEADERS, Request, Response

if TYPE_CHECKING:
    from .api import JobsApi


def retry_job(api: JobsApi, request: Request, raw_id: str) -> Response:
    from .api import _body, authenticate, idempotency_key, job_id_param

    key_hash = authenticate(request)
    job_id = job_id_param(request, raw_id)
    idem = idempotency_key(request)
    # The body, if any, is not read: a retry takes everything from the old job.
    body, replayed, new_id = _body(api.db.fetchone(
        dbmod.API_RETRY_JOB, (key_hash, job_id, idem, api.settings.queue_timeout_seconds)))
    new_id = str(new_id)
    headers = [*JSON_HEADERS, ("Location", f"{request.script_name}/jobs/{new_id}")]
    if replayed:
        headers.append(("Idempotent-Replayed", "true"))
    return Response(201, body.encode(), headers)
