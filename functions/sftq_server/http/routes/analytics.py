"""The read-only analytics routes: where the caller's jobs stand in the queue, a summary of
their history, and one job's figures. They may read a replica (settings.analytics_database_url);
the estimates take the tick interval and the usage grace into account."""

from __future__ import annotations

from sftq_server import db as dbmod
from sftq_server.core.settings import Settings
from sftq_server.http.checks import authenticate, job_id_param, one_row
from sftq_server.http.web import JSON_HEADERS, Request, Response


class AnalyticsApi:
    def __init__(self, settings: Settings, db: dbmod.Database) -> None:
        self.settings = settings
        self.db = db

    # GET /jobs/analytics/queue
    def queue_context(self, request: Request) -> Response:
        key_hash = authenticate(request)
        body = one_row(self.db.fetchone(dbmod.API_QUEUE_CONTEXT_AT, (
            key_hash, self.settings.tick_interval_seconds,
            self.settings.usage_grace_seconds)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))

    # GET /jobs/analytics/summary
    def summary(self, request: Request) -> Response:
        key_hash = authenticate(request)
        body = one_row(self.db.fetchone(dbmod.API_SUMMARY, (key_hash,)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))

    # GET /jobs/{id}/analytics
    def job_analytics(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        job_id = job_id_param(request, raw_id)
        body = one_row(self.db.fetchone(dbmod.API_JOB_ANALYTICS_AT, (
            key_hash, job_id, self.settings.tick_interval_seconds,
            self.settings.usage_grace_seconds)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))
