"""The scheduler tick: the only place where the database and the provider meet.

One tick, in order (docs/scheduling.md explains each step and what happens on faults):

 1. take the tick lease (sftq.tick_begin); if another tick holds it, do nothing at all;
 2. read every PROGRESS job (sftq.scheduler_work);
 3. reconcile submitted jobs with the provider's state: a listing per kind (pages of 200)
    when there are more than a few, a GET per job otherwise and for ids a listing missed;
 4. finish recorded cancels: stop the provider job (DELETE for SFT/DPO, :cancel for RFT),
    then PROGRESS -> CANCELLED;
 5. retry submissions an earlier tick left unfinished, under the same provider id;
 6. read the live quota and admit under the exclusive admission gate (sftq.admit_for_quota);
 7. create the admitted jobs at the provider;
 8. record the tick (sftq.tick_finish) and release the lease.

The database decides (admission, every state change); this module only carries facts
between the two sides. Every step is safe to repeat: a tick killed at any line leaves
work that the next tick finds in the database and finishes. No provider call is retried
inside a tick: the next tick, which re-reads the database first, is the retry.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

from . import db as sql
from .db import Database
from .errors import Conflict, NotFound, SftqError
from .provider import (
    KIND_COLLECTION,
    AlreadyExists,
    AuthError,
    FireworksClient,
    ProviderError,
    ProviderJob,
    Quota,
    Rejected,
    Transient,
    map_provider_state,
    provider_job_id,
)
from .provider import NotFound as ProviderNotFound
from .settings import Settings

logger = logging.getLogger(__name__)

# Above this many submitted jobs of one kind, reconcile lists the collection (200 a page)
# instead of one GET per job, so provider calls grow with pages, not with jobs.
LIST_THRESHOLD = 3
LIST_PAGE_SIZE = 200
# After this many transient provider failures in a row the tick stops calling the provider:
# during an outage each call costs a full timeout, and the next tick retries everything anyway.
MAX_CONSECUTIVE_TRANSIENT = 4
# The tick row and the HTTP answer carry short error strings, not a log.
MAX_ERRORS = 50
MAX_ERROR_CHARS = 300

TERMINAL = frozenset({"SUCCESS", "FAIL", "CANCELLED"})


class _LeaseLost(Exception):
    """The lease could not be renewed: it expired, and another tick may own the queue now."""


class _ProviderDown(Exception):
    """The tick gave up on the provider for the rest of this tick."""


class _Work(NamedTuple):
    """One row of sftq.scheduler_work(), in its column order."""

    job_id: uuid.UUID
    kind: str
    user_id: int
    gpu_count: int
    started_at: datetime | None
    submitted_at: datetime | None
    fireworks_job_name: str | None
    cancel_requested_at: datetime | None
    provider_state: str | None
    submit_attempts: int
    fireworks_payload: dict[str, Any] | None

    @property
    def provider_id(self) -> str:
        # The name the provider gave back wins (an adopted job carries it too); before any
        # create it is the deterministic id, which is what makes a blind stop or a retried
        # create address the one job a dead tick may have created.
        if self.fireworks_job_name:
            return self.fireworks_job_name.rsplit("/", 1)[-1]
        return provider_job_id(self.job_id)


class _Lease:
    """The tick lease, renewed between phases and whenever a quarter of it has passed."""

    def __init__(self, db: Database, tick_id: int, ttl: float) -> None:
        self.db = db
        self.tick_id = tick_id
        self.ttl = ttl
        self._renewed = time.monotonic()

    def keep(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self._renewed < self.ttl / 4:
            return
        if not self.db.scalar(sql.TICK_RENEW, (self.tick_id, self.ttl)):
            raise _LeaseLost
        self._renewed = time.monotonic()


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def default_holder() -> str:
    """Who holds the lease: host and process, enough to find a stuck tick's owner."""
    return f"{socket.gethostname()}:{os.getpid()}"[:200]


@dataclass
class _Tick:
    db: Database
    provider: FireworksClient
    settings: Settings
    lease: _Lease
    errors: list[str] = field(default_factory=list)
    quota: Quota | None = None
    budget: int | None = None
    ours_total: int | None = None
    ours_recent: int | None = None
    admitted: list[str] = field(default_factory=list)
    submitted: int = 0
    reconciled: int = 0
    cancelled: int = 0
    failed: int = 0
    # Jobs that left PROGRESS during this tick: later phases leave them alone.
    done: set[uuid.UUID] = field(default_factory=set)
    _transient_streak: int = 0
    _provider_down: bool = False
    _provider_refused: bool = False
    _dropped_errors: int = 0

    # -- bookkeeping --------------------------------------------------------------------

    def error(self, text: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(_short(text))
        else:
            self._dropped_errors += 1

    def ended(self, job_id: uuid.UUID, state: str | None) -> bool:
        """Count a job that this tick saw leave PROGRESS; True if it did."""
        if state not in TERMINAL:
            return False
        self.done.add(job_id)
        if state == "CANCELLED":
            self.cancelled += 1
        elif state == "FAIL":
            self.failed += 1
        return True

    # -- the provider, with a per-tick breaker ------------------------------------------

    def check_provider(self) -> None:
        if self._provider_down:
            raise _ProviderDown

    def provider_ok(self) -> None:
        self._transient_streak = 0

    def provider_failed(self, exc: ProviderError, what: str) -> None:
        """Record a failed call; stop calling the provider once it looks down or misconfigured."""
        self.error(f"{what}: {exc}")
        if isinstance(exc, AuthError):
            # Our key or account is wrong: every further call fails the same way.
            self._provider_refused = True
            self._trip("the provider refused our credentials")
            return
        if isinstance(exc, Transient):
            self._transient_streak += 1
            if self._transient_streak >= MAX_CONSECUTIVE_TRANSIENT:
                self._trip(f"{self._transient_streak} transient failures in a row")
        else:
            self._transient_streak = 0

    def _trip(self, why: str) -> None:
        if not self._provider_down:
            self._provider_down = True
            self.error(f"provider: {why}; no more provider calls this tick")

    # -- phase 3: reconcile -------------------------------------------------------------

    def reconcile(self, work: list[_Work]) -> None:
        by_kind: dict[str, list[_Work]] = {}
        for w in work:
            if w.submitted_at is not None:
                by_kind.setdefault(w.kind, []).append(w)
        for kind, jobs in by_kind.items():
            self.lease.keep()
            self.check_provider()
            seen: dict[str, ProviderJob] = {}
            if len(jobs) > LIST_THRESHOLD:
                try:
                    seen = self._list(kind, {w.provider_id for w in jobs})
                except ProviderError as exc:
                    # Without the listing, one GET per job would make an outage cost a
                    # timeout per job; the next tick lists again.
                    self.provider_failed(exc, f"reconcile {kind}: list")
                    continue
            for w in jobs:
                self._reconcile_one(w, seen.get(w.provider_id))

    def _list(self, kind: str, wanted: set[str]) -> dict[str, ProviderJob]:
        found: dict[str, ProviderJob] = {}
        jobs = self.provider.list_jobs(kind, page_size=LIST_PAGE_SIZE)
        try:
            for pj in jobs:
                if pj.job_id in wanted:
                    found[pj.job_id] = pj
                    if len(found) == len(wanted):
                        break  # stop paging: every id is accounted for
        finally:
            jobs.close()  # type: ignore[attr-defined]
        self.provider_ok()
        return found

    def _reconcile_one(self, w: _Work, pj: ProviderJob | None) -> None:
        self.lease.keep()
        state: str
        message: str | None = None
        if pj is None:
            self.check_provider()
            try:
                pj = self.provider.get_job(w.kind, w.provider_id)
            except ProviderNotFound:
                # Deleted outside the queue (or by a cancel we already sent).
                state = "NOT_FOUND"
                self.provider_ok()
            except ProviderError as exc:
                self.provider_failed(exc, f"reconcile {w.job_id}")
                return
            else:
                self.provider_ok()
        if pj is not None:
            map_provider_state(pj.state)  # logs a state we do not know (treated as running)
            state = pj.state or "JOB_STATE_UNSPECIFIED"
            message = pj.message
        try:
            new_state = self.db.scalar(sql.RECORD_PROVIDER_STATE, (w.job_id, state, message))
        except (NotFound, Conflict) as exc:
            self.error(f"reconcile {w.job_id}: {exc.message}")
            return
        if self.ended(w.job_id, new_state):
            self.reconciled += 1

    # -- phase 4: cancels ---------------------------------------------------------------

    def finish_cancels(self, work: list[_Work]) -> None:
        for w in work:
            if w.cancel_requested_at is None or w.job_id in self.done:
                continue
            self.lease.keep()
            self.check_provider()
            # Stopped even when never submitted: a create from a tick killed mid-way may
            # have reached the provider under this deterministic id (a 404 is fine).
            self._stop_and_complete(w.job_id, w.kind, w.provider_id,
                                    submitted=w.submitted_at is not None)

    def _stop_and_complete(self, job_id: uuid.UUID, kind: str, pid: str, *,
                           submitted: bool, after_create: bool = False) -> None:
        try:
            action = self.provider.stop_job(kind, pid)
        except ProviderError as exc:
            # Not completed: cancel_requested_at stays set, so the next tick tries again.
            self.provider_failed(exc, f"cancel {job_id}")
            return
        self.provider_ok()
        detail = {"provider_action": action, "provider_job_id": pid, "submitted": submitted}
        if after_create:
            detail["raced_create"] = True
        try:
            state = self.db.scalar(sql.COMPLETE_CANCEL, (job_id, "scheduler", json.dumps(detail)))
        except (NotFound, Conflict) as exc:
            self.error(f"cancel {job_id}: {exc.message}")
            return
        self.ended(job_id, state)

    # -- phases 5 and 7: submissions ----------------------------------------------------

    def retry_submissions(self, work: list[_Work]) -> None:
        pending = [w for w in work if w.submitted_at is None and w.cancel_requested_at is None
                   and w.job_id not in self.done]
        # Fewest attempts first (a stable sort keeps admission order among equals): a few
        # jobs whose creates keep failing must not use up every tick's failure budget ahead
        # of the others, tick after tick.
        pending.sort(key=lambda w: w.submit_attempts)
        for w in pending:
            self.lease.keep()
            self.check_provider()
            self.submit(w.job_id, w.kind, w.fireworks_payload or {}, w.gpu_count)

    def submit(self, job_id: uuid.UUID, kind: str, payload: dict[str, Any], gpu_count: int) -> None:
        pid = provider_job_id(job_id)
        adopted = False
        pj: ProviderJob | None
        try:
            pj = self.provider.create_job(kind, pid, payload, gpu_count=gpu_count)
        except AlreadyExists:
            # An earlier attempt reached the provider (its answer was lost, or its tick
            # died): adopt that job instead of making a second one.
            adopted = True
            try:
                pj = self.provider.get_job(kind, pid)
            except ProviderNotFound:
                pj = None  # gone between the 409 and the GET: deleted outside the queue
            except ProviderError as exc:
                self._submit_retry_later(job_id, exc, "adopt")
                return
        except AuthError as exc:
            # Our credentials, not the payload: keep the job and say why.
            self._submit_retry_later(job_id, exc, "create")
            return
        except Rejected as exc:
            self.provider_ok()
            body = exc.body or str(exc)
            try:
                state = self.db.scalar(sql.RECORD_SUBMIT_ERROR, (job_id, body, False))
            except (NotFound, Conflict) as err:
                self.error(f"submit {job_id}: {err.message}")
                return
            self.ended(job_id, state)
            return
        except ProviderError as exc:
            # Transient, or an answer we cannot classify: the job keeps its place and its id.
            self._submit_retry_later(job_id, exc, "create")
            return
        self.provider_ok()
        name = (pj.name if pj is not None and pj.name
                else f"accounts/{self.provider.account_id}/{KIND_COLLECTION[kind]}/{pid}")
        try:
            answer = self.db.scalar(sql.RECORD_SUBMITTED,
                                    (job_id, name, pj.state if pj else None, adopted))
        except (NotFound, Conflict) as exc:
            self.error(f"submit {job_id}: {exc.message}")
            return
        self.submitted += 1
        if pj is None:
            try:
                state = self.db.scalar(sql.RECORD_PROVIDER_STATE,
                                       (job_id, "NOT_FOUND", "provider job vanished after a 409"))
            except (NotFound, Conflict) as exc:
                self.error(f"submit {job_id}: {exc.message}")
                return
            if self.ended(job_id, state):
                self.reconciled += 1
            return
        if answer == "stop":
            # A cancel arrived while the create was in flight: stop it right away.
            self._stop_and_complete(job_id, kind, pid, submitted=True, after_create=True)

    def _submit_retry_later(self, job_id: uuid.UUID, exc: ProviderError, what: str) -> None:
        self.provider_failed(exc, f"submit {job_id}: {what}")
        try:
            self.db.scalar(sql.RECORD_SUBMIT_ERROR, (job_id, _short(str(exc)), True))
        except (NotFound, Conflict) as err:
            self.error(f"submit {job_id}: {err.message}")

    # -- phase 6: admission -------------------------------------------------------------

    def admit(self) -> list[dict[str, Any]]:
        if self._provider_refused:
            raise _ProviderDown
        # Even after a run of failed creates, read the quota once: those failures may belong
        # to a few jobs (the provider is otherwise fine), and skipping admission for them
        # would stall the whole queue behind them. A provider that is really down fails
        # this one call too.
        try:
            quota = self.provider.get_quota()
        except ProviderError as exc:
            # No fresh quota, no admission: the budget must come from the live figure.
            self.provider_failed(exc, "quota")
            return []
        self.provider_ok()
        self._provider_down = False
        self.quota = quota
        # Decimal, not float: the procedure takes numeric, and float8 -> numeric is not
        # an implicit cast, so a float would not resolve the function.
        usage = Decimal(repr(float(quota.usage)))
        answer = self.db.scalar(sql.ADMIT_FOR_QUOTA,
                                (quota.limit, usage, float(self.settings.usage_grace_seconds)))
        if isinstance(answer, str):
            answer = json.loads(answer)
        self.budget = answer.get("budget")
        self.ours_total = answer.get("ours_total")
        self.ours_recent = answer.get("ours_recent")
        jobs: list[dict[str, Any]] = list(answer.get("jobs") or [])
        self.admitted = [str(j["job_id"]) for j in jobs]
        return jobs

    def submit_admitted(self, jobs: Iterable[dict[str, Any]]) -> None:
        for job in jobs:
            job_id = uuid.UUID(str(job["job_id"]))
            self.lease.keep()
            try:
                self.check_provider()
            except _ProviderDown:
                # Admitted but not tried: say why on the job; the next tick submits it.
                self.db.scalar(sql.RECORD_SUBMIT_ERROR, (
                    job_id, "not attempted: the provider failed several calls in a row", True))
                continue
            self.submit(job_id, str(job["kind"]), dict(job.get("fireworks_payload") or {}),
                        int(job["gpu_count"]))

    # -- result -------------------------------------------------------------------------

    def result(self, tick_id: int, provider_calls: int, duration_ms: int,
               extra_error: str | None = None) -> dict[str, Any]:
        if extra_error:
            self.error(extra_error)
        errors = list(self.errors)
        if self._dropped_errors:
            errors.append(f"... and {self._dropped_errors} more errors")
        quota = None
        if self.quota is not None:
            quota = {"limit": self.quota.limit, "value": self.quota.value,
                     "max_value": self.quota.max_value, "usage": self.quota.usage}
        return {
            "status": "error" if errors else "ok",
            "tick_id": tick_id,
            "quota": quota,
            "budget": self.budget,
            "ours_total": self.ours_total,
            "ours_recent": self.ours_recent,
            "admitted": list(self.admitted),
            "submitted": self.submitted,
            "reconciled": self.reconciled,
            "cancelled": self.cancelled,
            "failed": self.failed,
            "errors": errors,
            "provider_calls": provider_calls,
            "duration_ms": duration_ms,
        }


def run_tick(db: Database, provider: FireworksClient, settings: Settings, *,
             holder: str | None = None) -> dict[str, Any]:
    """Run one scheduler tick and return what it did as a JSON-able dict.

    {"status": "skipped"} when another tick holds the lease. A database that cannot be
    reached before the lease is taken raises `errors.Unavailable`; any database or provider
    trouble after that ends the tick with status "error" (the lease is released, or expires
    if the database is gone).
    """
    started = time.monotonic()
    calls_before = provider.calls_made
    lease_seconds = float(settings.tick_lease_seconds)
    tick_id = db.scalar(sql.TICK_BEGIN, (holder or default_holder(), lease_seconds))
    if tick_id is None:
        return {"status": "skipped"}

    tick = _Tick(db, provider, settings, _Lease(db, int(tick_id), lease_seconds))
    failure: str | None = None
    unexpected: Exception | None = None
    try:
        _phases(tick)
    except _LeaseLost:
        failure = "lease lost: this tick ran past its lease; stopped early"
    except SftqError as exc:
        failure = f"database: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - recorded, then re-raised below
        failure = f"internal error: {type(exc).__name__}"
        unexpected = exc
    result = tick.result(int(tick_id), provider.calls_made - calls_before, _ms(started), failure)
    _finish(db, tick, result)
    result["duration_ms"] = _ms(started)
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


def _phases(tick: _Tick) -> None:
    rows = tick.db.fetchall(sql.SCHEDULER_WORK)
    work = [_Work(*row) for row in rows]
    for phase in (tick.reconcile, tick.finish_cancels, tick.retry_submissions):
        tick.lease.keep(force=True)
        # A provider that gave up ends the phase, not the tick: later phases still record
        # what they can, and each checks the breaker before calling out.
        with contextlib.suppress(_ProviderDown):
            phase(work)
    tick.lease.keep(force=True)
    with contextlib.suppress(_ProviderDown):
        tick.submit_admitted(tick.admit())


def _finish(db: Database, tick: _Tick, result: dict[str, Any]) -> None:
    # tick_finish reads `admitted` as a count and the quota as two flat keys; the full
    # answer rides along in `detail`.
    record = dict(result)
    record["admitted"] = len(tick.admitted)
    record["admitted_ids"] = list(tick.admitted)
    record["quota_limit"] = tick.quota.limit if tick.quota else None
    record["quota_usage"] = tick.quota.usage if tick.quota else None
    try:
        db.scalar(sql.TICK_FINISH, (tick.lease.tick_id, json.dumps(record)))
    except SftqError as exc:
        # The lease then expires by itself and the next tick marks this one abandoned.
        logger.warning("tick %s: could not record the tick: %s", tick.lease.tick_id, exc.message)
        result["errors"].append(_short(f"database: could not record the tick: {exc.message}"))
        result["status"] = "error"
