"""Phases 4 and 5, cancels: finish the cancels users recorded (stop the provider job, then
PROGRESS -> CANCELLED), and cancel the queued jobs whose queue timeout ran out (no provider
call). The stop is shared with submit, which stops a create a cancel raced.
"""

from __future__ import annotations

import json
import uuid

from sftq_server import db as sql
from sftq_server.provider import AuthError, ProviderError
from sftq_server.scheduler.tick.context import Tick, Work


def finish_cancels(tick: Tick, work: list[Work]) -> None:
    for w in work:
        if w.cancel_requested_at is None or w.job_id in tick.done:
            continue
        tick.lease.keep()
        tick.check_provider()
        # Stopped even when never submitted: a create from a tick killed mid-way may
        # have reached the provider under this deterministic id (a 404 is fine).
        with tick.job(w.job_id, "cancel", w.kind, w.fireworks_payload):
            stop_and_complete(tick, w.job_id, w.kind, w.provider_id,
                              submitted=w.submitted_at is not None)


def stop_and_complete(tick: Tick, job_id: uuid.UUID, kind: str, pid: str, *,
                      submitted: bool, after_create: bool = False) -> None:
    """Stop the provider job (DELETE for SFT/DPO, :cancel for RFT), then complete the cancel."""
    try:
        action = tick.provider.stop_job(kind, pid)
    except AuthError as exc:
        # Not completed either way: cancel_requested_at stays set for the next tick.
        if tick.refused(exc, f"cancel {job_id}"):
            tick.error(f"cancel {job_id}: refused for this job: {exc}")
        return
    except ProviderError as exc:
        # Not completed: cancel_requested_at stays set, so the next tick tries again.
        tick.provider_failed(exc, f"cancel {job_id}")
        return
    tick.provider_ok()
    detail = {"provider_action": action, "provider_job_id": pid, "submitted": submitted}
    if after_create:
        detail["raced_create"] = True
    state = tick.call(sql.COMPLETE_CANCEL, (job_id, "scheduler", json.dumps(detail)),
                      f"cancel {job_id}")
    tick.ended(job_id, state)


def expire_queued(tick: Tick, work: list[Work]) -> None:
    expired = int(tick.db.scalar(sql.EXPIRE_QUEUED) or 0)
    tick.queue_timeouts += expired
    tick.cancelled += expired
