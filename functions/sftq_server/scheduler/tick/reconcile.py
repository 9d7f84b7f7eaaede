"""Phase 3, reconcile: bring each submitted job's record up to what the provider says of it.

A listing per kind (pages of 200) when there are more than a few, a GET per job otherwise
and for ids a listing missed; when a kind's listing fails, GETs for its least recently
checked jobs only, so every job is reached over a few ticks at a bounded cost per tick.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sftq_server import db as sql
from sftq_server.provider import AuthError, ProviderError, ProviderJob
from sftq_server.provider import NotFound as ProviderNotFound
from sftq_server.scheduler.tick.context import (
    Tick,
    Work,
    as_dict,
    logger,
    observation,
    tick_wide,
)

# Above this many submitted jobs of one kind, reconcile lists the collection (200 a page)
# instead of one GET per job, so provider calls grow with pages, not with jobs.
LIST_THRESHOLD = 3
LIST_PAGE_SIZE = 200


def reconcile(tick: Tick, work: list[Work]) -> None:
    by_kind: dict[str, list[Work]] = {}
    for w in work:
        if w.submitted_at is not None:
            by_kind.setdefault(w.kind, []).append(w)
    for kind, jobs in by_kind.items():
        tick.lease.keep()
        tick.check_provider()
        if len(jobs) <= LIST_THRESHOLD:
            for w in jobs:
                with tick.job(w.job_id, "reconcile", w.kind, w.fireworks_payload):
                    reconcile_one(tick, w, None)
            continue
        try:
            seen = _list(tick, kind, {w.provider_id for w in jobs})
        except AuthError as exc:
            tick.refused(exc, f"reconcile {kind}: list")
            seen = None
        except ProviderError as exc:
            tick.provider_failed(exc, f"reconcile {kind}: list")
            seen = None
        except Exception as exc:
            # Anything else about the listing (an item nobody expected): no job is to blame,
            # so the kind falls back to GETs, which isolate whichever job it was.
            if tick_wide(exc):
                raise
            tick.error(f"reconcile {kind}: list: {type(exc).__name__}: {exc}")
            seen = None
        if seen is None:
            # Listing is down: GET the least recently checked few, so that every job of
            # the kind is reached over a few ticks, at a bounded cost per tick.
            fallback = sorted(jobs, key=lambda w: (w.provider_checked_at is not None,
                                                   w.provider_checked_at or datetime.min,
                                                   w.job_id))
            for w in fallback[: max(0, tick.settings.reconcile_get_limit)]:
                with tick.job(w.job_id, "reconcile", w.kind, w.fireworks_payload):
                    reconcile_one(tick, w, None)
            continue
        for w in jobs:
            with tick.job(w.job_id, "reconcile", w.kind, w.fireworks_payload):
                reconcile_one(tick, w, seen.get(w.provider_id))


def _list(tick: Tick, kind: str, wanted: set[str]) -> dict[str, ProviderJob]:
    found: dict[str, ProviderJob] = {}
    jobs = tick.provider.list_jobs(kind, page_size=LIST_PAGE_SIZE)
    try:
        for pj in jobs:
            if pj.job_id in wanted:
                found[pj.job_id] = pj
                if len(found) == len(wanted):
                    break  # stop paging: every id is accounted for
    finally:
        jobs.close()  # type: ignore[attr-defined]
    tick.provider_ok()
    return found


def reconcile_one(tick: Tick, w: Work, pj: ProviderJob | None) -> None:
    """One job: GET it unless a listing brought it, then sftq.observe_provider_job."""
    tick.lease.keep()
    obs: dict[str, Any]
    if pj is None:
        tick.check_provider()
        try:
            pj = tick.provider.get_job(w.kind, w.provider_id)
        except ProviderNotFound:
            # Deleted outside the queue (or by a cancel we already sent).
            tick.provider_ok()
            obs = {"state": "NOT_FOUND"}
        except AuthError as exc:
            if tick.refused(exc, f"reconcile {w.job_id}"):
                tick.error(f"reconcile {w.job_id}: refused for this job: {exc}")
            return
        except ProviderError as exc:
            tick.provider_failed(exc, f"reconcile {w.job_id}")
            return
        else:
            tick.provider_ok()
            obs = observation(pj)
    else:
        obs = observation(pj)
    answer = as_dict(tick.call(sql.OBSERVE_PROVIDER_JOB, (w.job_id, json.dumps(obs)),
                               f"reconcile {w.job_id}"))
    if answer.get("mapped") == "UNKNOWN":
        tick.unknown_states += 1
        if answer.get("first_unknown"):
            logger.warning("job %s: the provider reports state %r, which we do not know; "
                           "the job is left as it is", w.job_id, obs.get("state"))
    if tick.ended(w.job_id, answer.get("state")):
        tick.reconciled += 1
