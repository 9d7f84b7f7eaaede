"""GET /metrics: the queue's figures in the Prometheus text format, for operators' scrapers.

Every figure comes from one call, sftq.metrics() (sql/procedures/170_metrics.sql), which reads
counts the database keeps as jobs move; so any number of stateless copies of jobs-api answer
the same, and a scrape costs the same at a million jobs as at ten. Never public: the bearer
is the tick secret (or a token of it, as scheduler-tick takes) or SFTQ_METRICS_TOKEN.
docs/operations.md (Metrics) lists the series.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from sftq_server import db as dbmod
from sftq_server.core.errors import Unauthorized
from sftq_server.core.settings import Settings
from sftq_server.core.tick_secret import bearer_ok
from sftq_server.http.checks import check_query, one_row
from sftq_server.http.models import KINDS
from sftq_server.http.web import Request, Response

WEBHOOK_RESULTS = ("succeeded", "retrying", "failed")


def _le(bound: float) -> str:
    # As prometheus_client writes bucket bounds: "+Inf", "0.05", "30.0".
    return "+Inf" if bound == float("inf") else repr(float(bound))


def scrape_allowed(settings: Settings, authorization: str | None, now: float) -> bool:
    """The bearer is the tick secret (or a fresh token of it) or SFTQ_METRICS_TOKEN; both
    compared in constant time. With neither configured nothing is allowed."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return False
    by_secret = bool(settings.tick_secret) and bearer_ok(token, settings.tick_secret, now)
    by_token = bool(settings.metrics_token) and hmac.compare_digest(
        token.encode(), settings.metrics_token.encode())
    return by_secret or by_token


class Figures:
    """A prometheus_client collector over one answer of sftq.metrics()."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.counts: dict[str, list[tuple[dict[str, str], float]]] = {}
        for row in answer.get("counts") or ():
            self.counts.setdefault(row["name"], []).append((row["labels"], float(row["value"])))

    def _value(self, name: str, **labels: str) -> float:
        return sum(v for ls, v in self.counts.get(name, ()) if ls == labels)

    def _by(self, name: str, label: str, keys: tuple[str, ...] = ()) -> dict[str, float]:
        """One label's values summed, each of `keys` present (0 when nothing counted it)."""
        out = dict.fromkeys(keys, 0.0)
        for (value,), total in self._grouped(name, (label,)):
            out[value] = out.get(value, 0.0) + total
        return out

    def _histogram(self, name: str, doc: str) -> HistogramMetricFamily:
        per_bucket = self._by(f"{name}_bucket", "le")
        bounds = [float(b) for b in (self.answer.get("bounds") or {}).get(name) or ()]
        buckets: list[tuple[str, float]] = []
        seen = 0.0
        for bound in [*bounds, float("inf")]:
            seen += sum(v for le, v in per_bucket.items() if float(le) == bound)
            buckets.append((_le(bound), seen))
        return HistogramMetricFamily(f"sftq_{name}", doc, buckets=buckets,
                                     sum_value=self._value(f"{name}_sum"))

    def collect(self) -> Iterator[Metric]:
        a = self.answer
        for name, doc in (("pending_jobs", "Jobs waiting in the queue (QUEUED), by kind."),
                          ("running_jobs", "Jobs admitted and not ended (PROGRESS), by kind.")):
            gauge = GaugeMetricFamily(f"sftq_{name}", doc, labels=["kind"])
            for kind, value in self._by(name, "kind", KINDS).items():
                gauge.add_metric([kind], value)
            yield gauge
        yield self._histogram("admission_wait_time_seconds",
                              "Time from enqueue to admission of each admitted job.")
        yield CounterMetricFamily("sftq_admitted_jobs_total", "Jobs admitted (QUEUED -> PROGRESS).",
                                  value=self._value("admitted_jobs_total"))
        finished = CounterMetricFamily("sftq_finished_jobs_total",
                                       "Jobs that ended, by state and failure_class "
                                       "(empty unless FAIL).",
                                       labels=["state", "failure_class"])
        for ls, value in sorted(self._grouped("finished_jobs_total", ("state", "failure_class"))):
            finished.add_metric(list(ls), value)
        yield finished
        quota = GaugeMetricFamily("sftq_gpu_quota",
                                  "The provider's GPU quota at the newest reading: the value it "
                                  "enforces and its max.", labels=["kind"])
        for kind, value in (a.get("gpu_quota") or {}).items():
            if value is not None:
                quota.add_metric([kind], float(value))
        yield quota
        in_use = GaugeMetricFamily("sftq_gpu_in_use",
                                   "GPUs in use: by the queue's running jobs, and by others on the "
                                   "account (the newest usage reading less our jobs it counts).",
                                   labels=["owner"])
        in_use.add_metric(["queue"], self._value("running_gpus"))
        if a.get("gpu_external") is not None:
            in_use.add_metric(["external"], float(a["gpu_external"]))
        yield in_use
        yield self._histogram("tick_duration_seconds", "Wall time of each finished scheduler tick.")
        yield GaugeMetricFamily("sftq_tick_last_success_timestamp_seconds",
                                "When the newest tick without errors ended (Unix time; 0: never).",
                                value=float(a.get("tick_last_success") or 0))
        requests = CounterMetricFamily("sftq_provider_requests_total",
                                       "Provider calls of every process, by source (tick, "
                                       "preflight, validate, mcp, cancel), call and HTTP status "
                                       "(timeout, error: no answer; not_sent, over_budget: not "
                                       "sent).", labels=["source", "call", "status"])
        for ls, value in sorted(self._grouped("provider_requests_total",
                                              ("source", "call", "status"),
                                              {"source": "tick"})):
            requests.add_metric(list(ls), value)
        yield requests
        deliveries = CounterMetricFamily("sftq_webhook_deliveries_total",
                                         "Webhook delivery attempts, by result.", labels=["result"])
        for result, value in self._by("webhook_deliveries_total", "result",
                                      WEBHOOK_RESULTS).items():
            deliveries.add_metric([result], value)
        yield deliveries
        yield GaugeMetricFamily("sftq_stream_connections",
                                "Open live streams over every stream server, as of each one's "
                                "last refresh.", value=float(a.get("stream_connections") or 0))
        yield GaugeMetricFamily("sftq_stalled_jobs",
                                "Running jobs whose progress at Fireworks has not moved for "
                                "SFTQ_STALL_SECONDS (they are not cancelled).",
                                value=float(a.get("stalled_jobs") or 0))

    def _grouped(self, name: str, labels: tuple[str, ...],
                 defaults: dict[str, str] | None = None) -> list[tuple[tuple[str, ...], float]]:
        # `defaults`: the value of a label that older rows were kept without.
        out: dict[tuple[str, ...], float] = {}
        fill = defaults or {}
        for ls, v in self.counts.get(name, ()):
            key = tuple(str(ls.get(label, fill.get(label, ""))) for label in labels)
            out[key] = out.get(key, 0.0) + v
        return list(out.items())


def render(answer: dict[str, Any]) -> bytes:
    """The Prometheus text exposition of one sftq.metrics() answer."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Figures(answer))
    return generate_latest(registry)


class MetricsApi:
    def __init__(self, settings: Settings, db: dbmod.Database,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.db = db
        self._clock = clock

    # GET /metrics
    def metrics(self, request: Request) -> Response:
        if not scrape_allowed(self.settings, request.headers.get("authorization"), self._clock()):
            if not (self.settings.tick_secret or self.settings.metrics_token):
                message = ("GET /metrics is not public and no credential is configured: set "
                           "SFTQ_METRICS_TOKEN (or SFTQ_TICK_SECRET) on the server and send it "
                           "as Authorization: Bearer")
            else:
                message = ("missing or wrong metrics credential: send Authorization: Bearer "
                           "with SFTQ_METRICS_TOKEN or the tick secret")
            raise Unauthorized(message, headers={"WWW-Authenticate": "Bearer"})
        check_query(request, frozenset())
        answer = json.loads(one_row(self.db.fetchone(dbmod.METRICS))[0])
        return Response(200, render(answer),
                        [("Content-Type", CONTENT_TYPE_LATEST), ("Cache-Control", "no-store")])
