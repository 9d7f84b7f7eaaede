"""Phase 5b, pre-flight of waiting jobs: ask the provider about the resources of the queued
jobs jobs-api could not check at enqueue (sftq_server.preflight.resources), the nearest the
head first; a job whose dataset, evaluator or model does not exist ends FAIL before its turn.
"""

from __future__ import annotations

import contextlib
import json
import struct
import uuid
from typing import Any

from sftq_server import db as sql
from sftq_server.scheduler.tick.context import Tick, Work

# A waiting job whose pre-flight got no answer is tried again after this long.
PREFLIGHT_RETRY_SECONDS = 60.0


def preflight(tick: Tick, work: list[Work]) -> None:
    s = tick.settings
    if not s.preflight or s.preflight_tick_limit <= 0:
        return
    rows = tick.db.fetchall(sql.PREFLIGHT_WORK,
                            (s.preflight_tick_limit, PREFLIGHT_RETRY_SECONDS))
    if not rows:
        return
    cache: dict[str, tuple[str, str]] = {}
    for job_id, kind, payload, gpu_count, user_id in rows:
        tick.lease.keep()
        tick.check_provider()
        with tick.job(job_id, "preflight", kind, payload), _as_owner(tick, user_id):
            _check_one(tick, job_id, kind, dict(payload or {}), gpu_count, cache)


def _as_owner(tick: Tick, user_id: int) -> contextlib.AbstractContextManager[None]:
    """The lookups of one waiting job draw on its owner's share of the provider budget
    (source preflight), never on the tick's reserve: a user whose checks could not be made at
    enqueue (their share was spent) pays for them now, not everybody's admission. When the
    share is still spent the job is simply tried again later."""
    acting_for = getattr(tick.provider.budget, "acting_for", None)
    if acting_for is None:
        return contextlib.nullcontext()
    # The budget keys a user's share by the user's id as 8 bytes (int8send in SQL).
    ctx: contextlib.AbstractContextManager[None] = acting_for(
        "preflight", struct.pack(">q", int(user_id)))
    return ctx


def _check_one(tick: Tick, job_id: uuid.UUID, kind: str, payload: dict[str, Any],
               gpu_count: int, cache: dict[str, tuple[str, str]]) -> None:
    from sftq_server.preflight import findings_json
    from sftq_server.preflight.resources import check_resources

    report = check_resources(tick.provider, kind, payload, gpu_count,
                             budget_seconds=tick.provider.timeout, cache=cache)
    for exc in report.failures:
        tick.provider_failed(exc, f"pre-flight {job_id}")
    warnings = findings_json(report.warnings)
    if report.errors:
        findings = findings_json(report.errors)
        message = "pre-flight: " + "; ".join(f.message for f in report.errors)
        state = tick.call(sql.FAIL_PREFLIGHT, (job_id, findings, message, warnings),
                          f"pre-flight {job_id}")
        if state == "FAIL":
            tick.failed += 1
            tick.preflight_failed += 1
        return
    outcome = "checked" if report.answered else "unanswered"
    cost = json.dumps(report.estimated_cost) if report.estimated_cost is not None else None
    tick.call(sql.RECORD_PREFLIGHT, (job_id, outcome, warnings, cost), f"pre-flight {job_id}")
    tick.preflight_checked += report.answered
