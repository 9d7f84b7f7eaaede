"""One tick from end to end: take the lease, run the phases in order, record the tick.

The phases live in their own modules (reconcile, cancels, preflight, quota, submit); this
module only orders them, keeps the lease between them, and turns what happened into the
tick's answer and its row in sftq.scheduler_ticks (sftq.tick_finish).

Three passes (sftq_server.scheduler.wake says who fires which, and when):
- "tick", the periodic tick, and "wake", a tick woken by the queue's own events (a submit, a
  cancel, a job's end): every phase. Just before admitting, either takes the pending wake
  (sftq.admission_wake_take), so what committed before that is admitted now and what
  commits later wakes the next tick;
- "reconcile", between periodic ticks while jobs run: only the running jobs' states from
  the provider (a listing per kind). When one of them ended, the quota is read and the freed
  room admitted in the same pass; otherwise the pass stops there, one call per kind spent.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC
from typing import Any

from sftq_server import db as sql
from sftq_server.core.errors import SftqError
from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.provider import FireworksClient
from sftq_server.scheduler.tick.cancels import expire_queued, finish_cancels
from sftq_server.scheduler.tick.context import (
    Lease,
    LeaseLost,
    ProviderDown,
    Tick,
    Work,
    as_dict,
    default_holder,
    logger,
    ms,
    short,
)
from sftq_server.scheduler.tick.preflight import preflight
from sftq_server.scheduler.tick.quota import read_quota, reread_quota
from sftq_server.scheduler.tick.reconcile import reconcile
from sftq_server.scheduler.tick.run_limits import run_limits
from sftq_server.scheduler.tick.submit import admit, retry_submissions, submit_admitted
from sftq_server.scheduler.wake import Pass

# The phases that run before admission, in order; each takes the tick and its work rows.
# A provider that gave up (ProviderDown) ends the phase, not the tick.
PHASES = (reconcile, run_limits, finish_cancels, expire_queued, preflight, read_quota,
          retry_submissions)


def run_tick(db: Database, provider: FireworksClient, settings: Settings, *,
             holder: str | None = None, pass_: Pass = "tick") -> dict[str, Any]:
    """Run one scheduler tick (or a reconcile pass: `pass_`) and return what it did as a
    JSON-able dict.

    {"status": "skipped"} when another tick holds the lease. A database that cannot be
    reached before the lease is taken raises `errors.Unavailable`; any database or provider
    trouble after that ends the tick with status "error" (the lease is released, or expires
    if the database is gone).
    """
    started = time.monotonic()
    calls_before = provider.calls_made
    counts_before = dict(provider.call_counts)
    lease_seconds = float(settings.tick_lease_seconds)
    tick_id = db.scalar(sql.TICK_BEGIN, (holder or default_holder(), lease_seconds))
    if tick_id is None:
        return {"status": "skipped"}

    tick = Tick(db, provider, settings, Lease(db, int(tick_id), lease_seconds))
    failure: str | None = None
    unexpected: Exception | None = None
    woken: dict[str, Any] = {}
    try:
        _phases(tick, pass_, woken)
    except LeaseLost:
        failure = "lease lost: this tick ran past its lease; stopped early"
    except SftqError as exc:
        failure = f"database: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - recorded, then re-raised below
        failure = f"internal error: {type(exc).__name__}"
        unexpected = exc
    result = tick.result(int(tick_id), provider.calls_made - calls_before, ms(started), failure)
    result["provider_requests"] = _calls_since(counts_before, provider.call_counts)
    # Which pass this was, and the wake it took ({} when none was pending or it did not
    # admit): requested_at, requested_by (submit, cancel, ended...) and waited_ms.
    result["pass"] = pass_
    result["wake"] = woken
    _finish(db, tick, result)
    result["duration_ms"] = ms(started)
    logger.info(
        "tick %s %s: admitted %d, submitted %d, reconciled %d, cancelled %d, failed %d, "
        "%d error(s), %d provider call(s), %d ms",
        tick_id, result["status"], len(tick.admitted), tick.submitted, tick.reconciled,
        tick.cancelled, tick.failed, len(result["errors"]), result["provider_calls"],
        result["duration_ms"])
    for line in result["errors"]:
        logger.warning("tick %s: %s", tick_id, line)
    if unexpected is not None:
        raise unexpected
    return result


def _calls_since(before: dict[tuple[str, str], int],
                 now: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    """This tick's provider calls by (call, status); tick_finish adds them to
    sftq_provider_requests_total (sql/procedures/170_metrics.sql)."""
    return [{"call": call, "status": status, "count": n - before.get((call, status), 0)}
            for (call, status), n in sorted(dict(now).items())
            if n > before.get((call, status), 0)]


def _phases(tick: Tick, pass_: Pass, woken: dict[str, Any]) -> None:
    rows = tick.db.fetchall(sql.SCHEDULER_WORK)
    work = [Work(*row) for row in rows]
    tick.fault_runs = {uuid.UUID(str(row[0])) for row in tick.db.fetchall(sql.FAULTED_JOBS)}
    until = tick.db.scalar(sql.PROVIDER_BACKOFF_UNTIL)
    if until is not None:
        # An earlier tick was told to wait (429 Retry-After) until then: no provider call
        # before it; what needs only the database still runs.
        tick.backoff_until = until.timestamp()
        tick.trip(f"rate limited: the provider's Retry-After runs until "
                  f"{until.astimezone(UTC).isoformat(timespec='seconds')}")
    phases: tuple[Callable[[Tick, list[Work]], None], ...] = PHASES
    if pass_ == "reconcile":
        tick.lease.keep(force=True)
        with contextlib.suppress(ProviderDown):
            reconcile(tick, work)
        if not tick.done:
            return  # nothing ended at the provider: no room freed, nothing to admit
        phases = (read_quota,)
    for phase in phases:
        tick.lease.keep(force=True)
        # A provider that gave up ends the phase, not the tick: later phases still record
        # what they can, and each checks the breaker before calling out.
        with contextlib.suppress(ProviderDown):
            phase(tick, work)
    tick.lease.keep(force=True)
    # The wake is taken even when admission cannot run (no quota reading): the periodic
    # tick retries then, rather than woken ticks one after another.
    woken.update(as_dict(tick.db.scalar(sql.ADMISSION_WAKE_TAKE)))
    submit_admitted(tick, admit(tick))
    with contextlib.suppress(ProviderDown):
        reread_quota(tick)
    tick.lease.keep(force=True)
    if tick.fault_runs:
        # Jobs handled without a fault this time: their runs of faults end.
        tick.db.scalar(sql.CLEAR_JOB_FAULTS, (tick.faults_cleared(),))
    # The queue's stretch counts (sql/procedures/062_queue_buckets.sql), in a transaction of
    # their own: the seal holds the admission gate exclusively, briefly, after admission.
    tick.db.scalar(sql.QUEUE_SEAL)


def _finish(db: Database, tick: Tick, result: dict[str, Any]) -> None:
    # tick_finish reads `admitted` as a count and the quota as two flat keys; the full
    # answer rides along in `detail`.
    record = dict(result)
    record["admitted"] = len(tick.admitted)
    record["admitted_ids"] = list(tick.admitted)
    record["quota_limit"] = tick.quota.limit if tick.quota else None
    record["quota_usage"] = tick.quota.usage if tick.quota else None
    # The end-of-tick queue frames (sftq.stream_queue_refresh) judge a stalled scheduler and
    # place estimates with the deployment's settings, as GET /jobs/analytics/queue does.
    record["tick_interval_seconds"] = float(tick.settings.tick_interval_seconds)
    record["usage_grace_seconds"] = float(tick.settings.usage_grace_seconds)
    try:
        db.scalar(sql.TICK_FINISH, (tick.lease.tick_id, json.dumps(record)))
    except SftqError as exc:
        # The lease then expires by itself and the next tick marks this one abandoned.
        logger.warning("tick %s: could not record the tick: %s", tick.lease.tick_id, exc.message)
        result["errors"].append(short(f"database: could not record the tick: {exc.message}"))
        result["status"] = "error"
