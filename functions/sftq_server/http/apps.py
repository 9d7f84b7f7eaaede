"""The route table: every route of the two HTTP functions, in one place, and what answers it.

jobs-api is the contract's API (plus webhooks and the dashboard); analytics serves the read-only
routes again from a database that may be a replica. A route's handler lives in http/routes/, one
module per concept; adding a route is one line here and one method there. The live stream's two
paths are answered here with a 501 (clients then poll); an async server (the gateway,
functions/jobs_stream.py) serves them for real.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

from sftq_server import db as dbmod
from sftq_server.core.settings import Settings
from sftq_server.http.routes.analytics import AnalyticsApi
from sftq_server.http.routes.capacity import CapacityApi
from sftq_server.http.routes.dashboard import DashboardApi
from sftq_server.http.routes.events import EventsApi
from sftq_server.http.routes.jobs import JobsApi, ProviderFactory
from sftq_server.http.routes.meta import MetaApi
from sftq_server.http.routes.metrics import MetricsApi
from sftq_server.http.routes.webhooks import WebhooksApi
from sftq_server.http.web import App, RouteFn, Router
from sftq_server.stream.paths import stream_unavailable


class Handlers:
    """The objects whose methods answer routes, built on first use over one pool."""

    def __init__(self, settings: Settings, db: dbmod.Database,
                 provider_factory: ProviderFactory | None = None) -> None:
        self.settings = settings
        self.db = db
        self.max_body = settings.max_body_bytes
        self._provider_factory = provider_factory

    @cached_property
    def jobs(self) -> JobsApi:
        return JobsApi(self.settings, self.db, self._provider_factory)

    @cached_property
    def analytics(self) -> AnalyticsApi:
        return AnalyticsApi(self.settings, self.db)

    @cached_property
    def meta(self) -> MetaApi:
        return MetaApi(self.db)

    @cached_property
    def events(self) -> EventsApi:
        return EventsApi(self.db)

    @cached_property
    def capacity(self) -> CapacityApi:
        return CapacityApi(self.settings, self.db)

    @cached_property
    def webhooks(self) -> WebhooksApi:
        return WebhooksApi(self.settings, self.db)

    @cached_property
    def metrics(self) -> MetricsApi:
        return MetricsApi(self.settings, self.db)

    @cached_property
    def dashboard(self) -> DashboardApi:
        return DashboardApi(self.settings, self.db)

    def close(self) -> None:
        """Close the provider client the jobs routes built, if they did (the pool stays)."""
        if "jobs" in self.__dict__:
            self.jobs.close()


RouteRow = tuple[str, str, Callable[[Handlers], RouteFn]]

# Static paths win over templates whatever the order (see Router), so /jobs/analytics/queue is
# never taken for /jobs/{id}.
JOBS_API: list[RouteRow] = [
    ("POST", "/jobs", lambda h: h.jobs.submit),
    ("POST", "/jobs:validate", lambda h: h.jobs.validate),
    ("GET", "/jobs", lambda h: h.jobs.list_jobs),
    ("GET", "/jobs/{id}", lambda h: h.jobs.get_job),
    ("DELETE", "/jobs/{id}", lambda h: h.jobs.cancel_job),
    ("POST", "/jobs/{id}/retry", lambda h: h.jobs.retry),
    ("GET", "/jobs/{id}/events", lambda h: h.events.list_events),
    ("GET", "/jobs/analytics/queue", lambda h: h.analytics.queue_context),
    ("GET", "/jobs/analytics/summary", lambda h: h.analytics.summary),
    ("GET", "/jobs/{id}/analytics", lambda h: h.analytics.job_analytics),
    ("GET", "/capacity", lambda h: h.capacity.capacity),
    ("GET", "/jobs/stream", lambda h: stream_unavailable),
    ("GET", "/jobs/{id}/stream", lambda h: stream_unavailable),
    # Webhooks (docs/webhooks.md).
    ("POST", "/webhooks", lambda h: h.webhooks.create),
    ("GET", "/webhooks", lambda h: h.webhooks.list),
    ("GET", "/webhooks/{id}", lambda h: h.webhooks.get),
    ("DELETE", "/webhooks/{id}", lambda h: h.webhooks.delete),
    ("POST", "/webhooks/{id}/test", lambda h: h.webhooks.test),
    ("GET", "/webhooks/{id}/deliveries", lambda h: h.webhooks.deliveries),
    # The web dashboard: its page and files, and the read-only routes it reads.
    ("GET", "/dashboard", lambda h: h.dashboard.page),
    ("GET", "/dashboard/{name}", lambda h: h.dashboard.asset),
    ("GET", "/queue", lambda h: h.dashboard.queue),
    ("GET", "/jobs/{id}/payload", lambda h: h.dashboard.payload),
    ("GET", "/jobs/analytics/history", lambda h: h.dashboard.history),
    ("GET", "/capacity/history", lambda h: h.dashboard.gpu_history),
    ("GET", "/health", lambda h: h.meta.health),
    ("GET", "/openapi.json", lambda h: h.meta.openapi),
    # Prometheus scrape, for operators (tick secret or SFTQ_METRICS_TOKEN; docs/operations.md).
    ("GET", "/metrics", lambda h: h.metrics.metrics),
]

ANALYTICS: list[RouteRow] = [
    ("GET", "/jobs/analytics/queue", lambda h: h.analytics.queue_context),
    ("GET", "/jobs/analytics/summary", lambda h: h.analytics.summary),
    ("GET", "/jobs/{id}/analytics", lambda h: h.analytics.job_analytics),
    ("GET", "/health", lambda h: h.meta.health),
]


class ApiApp(App):
    """An App that also owns the handlers and the pool behind it (for close())."""

    def __init__(self, routes: list[RouteRow], api: Handlers, *, name: str,
                 mount_prefix: str) -> None:
        router = Router()
        for method, path, handler in routes:
            router.add(method, path, handler(api))
        super().__init__(router, name=name, mount_prefix=mount_prefix)
        self.api = api

    def close(self) -> None:
        self.api.close()
        self.api.db.close()


def _database(settings: Settings, url: str) -> dbmod.Database:
    if not url:
        raise ValueError("no database URL: set DATABASE_URL")
    return dbmod.get_database(url, max_size=settings.db_pool_max,
                              timeout=settings.db_timeout_seconds)


def make_jobs_api(settings: Settings, *, db: dbmod.Database | None = None,
                  provider_factory: ProviderFactory | None = None) -> ApiApp:
    """The jobs-api handler (Request -> Response): every route of the contract."""
    api = Handlers(settings, db or _database(settings, settings.database_url), provider_factory)
    return ApiApp(JOBS_API, api, name="jobs-api", mount_prefix="/functions/v1/jobs-api")


def make_analytics_api(settings: Settings, *, db: dbmod.Database | None = None) -> ApiApp:
    """The read-only analytics handler; it may point at a replica (ANALYTICS_DATABASE_URL)."""
    api = Handlers(settings, db or _database(settings, settings.analytics_url))
    return ApiApp(ANALYTICS, api, name="analytics", mount_prefix="/functions/v1/analytics")
