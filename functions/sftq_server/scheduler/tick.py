"""The scheduler tick: the only place where the database and the provider meet.

One tick, in order (docs/scheduling.md explains each step and what happens on faults):

 1. take the tick lease (sftq.tick_begin); if another tick holds it, do nothing at all;
 2. read every PROGRESS job (sftq.scheduler_work);
 3. reconcile submitted jobs with the provider's state and progress: a listing per kind
    (pages of 200) when there are more than a few, a GET per job otherwise and for ids a
    listing missed; when a kind's listing fails, GETs for its least recently checked jobs;
 4. finish recorded cancels: stop the provider job (DELETE for SFT/DPO, :cancel for RFT),
    then PROGRESS -> CANCELLED;
 5. cancel queued jobs whose queue timeout ran out (no provider call);
 5b. pre-flight: ask the provider about the resources of waiting jobs jobs-api could not
    check at enqueue (sftq_server.preflight.resources), the nearest the head first; a job
    whose dataset, evaluator or model does not exist ends FAIL before its turn;
 6. read the live quota (401/403 here: our credentials are refused; nothing else runs);
 7. retry creates an earlier tick left unfinished, under the same provider id, once their
    backoff has passed and only while they still fit that quota (sftq.creates_that_fit:
    usage outside the queue may have grown since their admission); give up on those out of
    attempts or time (after one last GET, which is itself retried under the backoff a few
    times at most when it cannot be made);
 8. admit under the exclusive admission gate (sftq.admit_for_quota) with that quota;
 9. create the admitted jobs at the provider;
10. if anything was created, read the quota again: what it shows of our new jobs stops
    being counted twice (sftq.record_usage_reading);
11. record the tick (sftq.tick_finish) and release the lease.

The database decides (admission, every state change, the failure class); this module only
carries facts between the two sides. Every step is safe to repeat: a tick killed at any
line leaves work that the next tick finds in the database and finishes. No provider call is
retried inside a tick: the next tick, which re-reads the database first, is the retry.

A 429 (over the account's request rate) on any call stops the tick's provider calls; its
Retry-After is recorded with the tick, and the ticks that start before it ends make no
provider call at all. A 429 never costs a job an attempt, so it never fails a job.
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
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NamedTuple

from sftq_server import db as sql
from sftq_server.core.errors import Conflict, NotFound, SftqError
from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.provider import (
    KIND_COLLECTION,
    AlreadyExists,
    AuthError,
    FireworksClient,
    ProviderError,
    ProviderJob,
    Quota,
    RateLimited,
    Rejected,
    provider_job_id,
)
from sftq_server.provider import NotFound as ProviderNotFound

logger = logging.getLogger(__name__)

# Above this many submitted jobs of one kind, reconcile lists the collection (200 a page)
# instead of one GET per job, so provider calls grow with pages, not with jobs.
LIST_THRESHOLD = 3
LIST_PAGE_SIZE = 200
# After this many transient provider failures in a row the tick stops calling the provider:
# during an outage each call costs a full timeout, and the next tick retries everything anyway.
MAX_CONSECUTIVE_TRANSIENT = 4
# A Retry-After is honoured across ticks up to this long.
MAX_BACKOFF_SECONDS = 900.0
# A waiting job whose pre-flight got no answer is tried again after this long.
PREFLIGHT_RETRY_SECONDS = 60.0
# The tick row and the HTTP answer carry short error strings, not a log.
MAX_ERRORS = 50
MAX_ERROR_CHARS = 300

TERMINAL = frozenset({"SUCCESS", "FAIL", "CANCELLED"})
NOT_ATTEMPTED = "not attempted: the provider failed several calls in a row"
AUTH_REFUSED = "not attempted: the provider refused our credentials (401/403 on the account)"
RATE_LIMITED = "not attempted: the provider is rate limiting us"
NO_QUOTA_READING = ("not attempted: no quota reading this tick, so nothing shows the job still "
                    "fits; the create is sent once a reading does")


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
    submit_due: bool
    admitted_seconds: float | None
    provider_checked_at: datetime | None
    last_submit_error: str | None
    last_check_failures: int

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


def _as_dict(answer: Any) -> dict[str, Any]:
    if isinstance(answer, str):
        answer = json.loads(answer)
    return dict(answer) if isinstance(answer, dict) else {}


def default_holder() -> str:
    """Who holds the lease: host and process, enough to find a stuck tick's owner."""
    return f"{socket.gethostname()}:{os.getpid()}"[:200]


def observation(pj: ProviderJob) -> dict[str, Any]:
    """What sftq.observe_provider_job takes from one provider job."""
    return {
        "state": pj.state,
        "message": pj.message,
        "status_code": pj.status_code,
        "percent": pj.progress_percent,
        "epoch": pj.progress_epoch,
        "estimated_cost": pj.estimated_cost,
    }


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
    queue_timeouts: int = 0
    gave_up: int = 0
    creates_held: int = 0
    unknown_states: int = 0
    usage_after: float | None = None
    usage_counted_gpus: int = 0
    # True: the provider refused our credentials on an account-level call; False: an
    # account-level call succeeded in this tick; None: this tick could not tell.
    auth_failed: bool | None = None
    # Jobs that left PROGRESS during this tick: later phases leave them alone.
    done: set[uuid.UUID] = field(default_factory=set)
    _created: int = 0
    # The account probe after a 401/403 on a job: run at most once per tick.
    _probed: bool = False
    _probe_ok: bool = False
    _transient_streak: int = 0
    _provider_down: bool = False
    _dropped_errors: int = 0
    # Jobs the pre-flight ended, and checked with an answer.
    preflight_failed: int = 0
    preflight_checked: int = 0
    # The end of a 429's Retry-After (epoch seconds) this tick met or started inside.
    backoff_until: float | None = None

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

    def call(self, query: str, params: tuple[Any, ...], what: str) -> Any:
        """A procedure whose coded refusal (the job moved on meanwhile) is not the tick's
        failure: it is noted and the tick goes on."""
        try:
            return self.db.scalar(query, params)
        except (NotFound, Conflict) as exc:
            self.error(f"{what}: {exc.message}")
            return None

    # -- the provider, with a per-tick breaker ------------------------------------------

    def check_provider(self) -> None:
        if self._provider_down:
            raise _ProviderDown

    def provider_ok(self) -> None:
        self._transient_streak = 0

    def provider_failed(self, exc: ProviderError, what: str) -> None:
        """Record a failed call; stop calling the provider once it looks down, or at once
        when it asks us to slow down (429)."""
        self.error(f"{what}: {exc}")
        if isinstance(exc, RateLimited):
            self.rate_limited(exc)
            return
        if isinstance(exc, Rejected):
            self._transient_streak = 0
            return
        self._transient_streak += 1
        if self._transient_streak >= MAX_CONSECUTIVE_TRANSIENT:
            self._trip(f"{self._transient_streak} transient failures in a row")

    def rate_limited(self, exc: RateLimited) -> None:
        """A 429: no more provider calls this tick, nor before its Retry-After ends."""
        wait = exc.retry_after if exc.retry_after is not None else self.provider.quiet_for
        if wait:
            until = time.time() + min(wait, MAX_BACKOFF_SECONDS)
            self.backoff_until = max(self.backoff_until or 0.0, until)
        self._trip("rate limited (HTTP 429)" + (f"; Retry-After {wait:g} s" if wait else ""))

    def _trip(self, why: str) -> None:
        if not self._provider_down:
            self._provider_down = True
            self.error(f"provider: {why}; no more provider calls this tick")

    def refused(self, exc: AuthError, what: str) -> bool:
        """A 401/403 on a call about one job: is it the job, or our credentials?

        Probes an account-level call (the quota read) right then, once per tick. Answers
        True when the account is fine, so the refusal concerns this job alone. When the
        probe is refused too, the credentials are bad: the tick flags it, makes no more
        provider calls and raises _ProviderDown, changing no job. A probe that fails
        otherwise decides nothing: the caller treats the refusal as a transient failure.
        """
        if self.auth_failed:
            raise _ProviderDown
        if not self._probed:
            self._probed = True
            try:
                self.provider.get_quota()
            except AuthError as probe:
                self._credentials_refused(probe, f"{what}: account probe")
            except ProviderError as probe:
                self.provider_failed(probe, f"{what}: account probe after HTTP {exc.status}")
            else:
                self.provider_ok()
                self.auth_failed = False
                self._probe_ok = True
        return self._probe_ok

    def _credentials_refused(self, exc: AuthError, what: str) -> None:
        self.auth_failed = True
        self.error(f"{what}: provider_auth_failed: {exc}")
        self._trip("provider_auth_failed: the provider refused our credentials")
        raise _ProviderDown

    # -- phase 3: reconcile -------------------------------------------------------------

    def reconcile(self, work: list[_Work]) -> None:
        by_kind: dict[str, list[_Work]] = {}
        for w in work:
            if w.submitted_at is not None:
                by_kind.setdefault(w.kind, []).append(w)
        for kind, jobs in by_kind.items():
            self.lease.keep()
            self.check_provider()
            if len(jobs) <= LIST_THRESHOLD:
                for w in jobs:
                    self._reconcile_one(w, None)
                continue
            try:
                seen = self._list(kind, {w.provider_id for w in jobs})
            except AuthError as exc:
                self.refused(exc, f"reconcile {kind}: list")
                seen = None
            except ProviderError as exc:
                self.provider_failed(exc, f"reconcile {kind}: list")
                seen = None
            if seen is None:
                # Listing is down: GET the least recently checked few, so that every job of
                # the kind is reached over a few ticks, at a bounded cost per tick.
                fallback = sorted(jobs, key=lambda w: (w.provider_checked_at is not None,
                                                       w.provider_checked_at or datetime.min,
                                                       w.job_id))
                for w in fallback[: max(0, self.settings.reconcile_get_limit)]:
                    self._reconcile_one(w, None)
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
        obs: dict[str, Any]
        if pj is None:
            self.check_provider()
            try:
                pj = self.provider.get_job(w.kind, w.provider_id)
            except ProviderNotFound:
                # Deleted outside the queue (or by a cancel we already sent).
                self.provider_ok()
                obs = {"state": "NOT_FOUND"}
            except AuthError as exc:
                if self.refused(exc, f"reconcile {w.job_id}"):
                    self.error(f"reconcile {w.job_id}: refused for this job: {exc}")
                return
            except ProviderError as exc:
                self.provider_failed(exc, f"reconcile {w.job_id}")
                return
            else:
                self.provider_ok()
                obs = observation(pj)
        else:
            obs = observation(pj)
        answer = _as_dict(self.call(sql.OBSERVE_PROVIDER_JOB, (w.job_id, json.dumps(obs)),
                                    f"reconcile {w.job_id}"))
        if answer.get("mapped") == "UNKNOWN":
            self.unknown_states += 1
            if answer.get("first_unknown"):
                logger.warning("job %s: the provider reports state %r, which we do not know; "
                               "the job is left as it is", w.job_id, obs.get("state"))
        if self.ended(w.job_id, answer.get("state")):
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
        except AuthError as exc:
            # Not completed either way: cancel_requested_at stays set for the next tick.
            if self.refused(exc, f"cancel {job_id}"):
                self.error(f"cancel {job_id}: refused for this job: {exc}")
            return
        except ProviderError as exc:
            # Not completed: cancel_requested_at stays set, so the next tick tries again.
            self.provider_failed(exc, f"cancel {job_id}")
            return
        self.provider_ok()
        detail = {"provider_action": action, "provider_job_id": pid, "submitted": submitted}
        if after_create:
            detail["raced_create"] = True
        state = self.call(sql.COMPLETE_CANCEL, (job_id, "scheduler", json.dumps(detail)),
                          f"cancel {job_id}")
        self.ended(job_id, state)

    # -- phase 5: queue timeouts --------------------------------------------------------

    def expire_queued(self, work: list[_Work]) -> None:
        expired = int(self.db.scalar(sql.EXPIRE_QUEUED) or 0)
        self.queue_timeouts += expired
        self.cancelled += expired

    # -- phase 5b: pre-flight of waiting jobs --------------------------------------------

    def preflight(self, work: list[_Work]) -> None:
        s = self.settings
        if not s.preflight or s.preflight_tick_limit <= 0:
            return
        rows = self.db.fetchall(sql.PREFLIGHT_WORK,
                                (s.preflight_tick_limit, PREFLIGHT_RETRY_SECONDS))
        if not rows:
            return
        from sftq_server.preflight import findings_json
        from sftq_server.preflight.resources import check_resources

        cache: dict[str, tuple[str, str]] = {}
        for job_id, kind, payload, gpu_count in rows:
            self.lease.keep()
            self.check_provider()
            report = check_resources(self.provider, kind, dict(payload or {}), gpu_count,
                                     budget_seconds=self.provider.timeout, cache=cache)
            for exc in report.failures:
                self.provider_failed(exc, f"pre-flight {job_id}")
            warnings = findings_json(report.warnings)
            if report.errors:
                findings = findings_json(report.errors)
                message = "pre-flight: " + "; ".join(f.message for f in report.errors)
                state = self.call(sql.FAIL_PREFLIGHT, (job_id, findings, message, warnings),
                                  f"pre-flight {job_id}")
                if state == "FAIL":
                    self.failed += 1
                    self.preflight_failed += 1
                continue
            outcome = "checked" if report.answered else "unanswered"
            cost = json.dumps(report.estimated_cost) if report.estimated_cost is not None \
                else None
            self.call(sql.RECORD_PREFLIGHT, (job_id, outcome, warnings, cost),
                      f"pre-flight {job_id}")
            self.preflight_checked += report.answered

    # -- phase 6: the quota -------------------------------------------------------------

    def read_quota(self, work: list[_Work]) -> None:
        # Read even after a run of failed calls: those failures may belong to a few jobs
        # (the provider is otherwise fine), and skipping admission for them would stall the
        # whole queue behind them. A provider that is really down fails this one call too.
        if self.auth_failed or self.backoff_until is not None:
            raise _ProviderDown  # refused credentials, or a Retry-After still running
        try:
            quota = self.provider.get_quota()
        except AuthError as exc:
            self._credentials_refused(exc, "quota")
        except ProviderError as exc:
            # No fresh quota, no admission: the budget must come from the live figure.
            self.provider_failed(exc, "quota")
            return
        self.provider_ok()
        self._provider_down = False
        self.auth_failed = False
        self.quota = quota

    # -- phases 7 and 9: submissions ----------------------------------------------------

    def _exhausted(self, w: _Work) -> bool:
        s = self.settings
        # While the provider rate-limits us the clock does not run out on a job: a 429 is
        # never the job's failure (its first other answer starts the bound again).
        rate_limited = (w.last_submit_error or "").startswith(RATE_LIMITED)
        return w.submit_attempts >= s.submit_max_attempts or (
            not rate_limited and w.admitted_seconds is not None
            and w.admitted_seconds >= s.submit_max_seconds)

    def retry_submissions(self, work: list[_Work]) -> None:
        pending = [w for w in work if w.submitted_at is None and w.cancel_requested_at is None
                   and w.job_id not in self.done]
        # Fewest attempts first (a stable sort keeps admission order among equals): a few
        # jobs whose creates keep failing must not use up every tick's failure budget ahead
        # of the others, tick after tick.
        pending.sort(key=lambda w: w.submit_attempts)
        held = self._held_for_room(pending)
        for w in pending:
            exhausted = self._exhausted(w)
            # Out of attempts or time, the first final check is made at once; one that could
            # not be made waits out the backoff like a create.
            if not w.submit_due and not (exhausted and w.last_check_failures == 0):
                continue  # still in its backoff
            self.lease.keep()
            self.check_provider()
            if exhausted:
                self.last_check(w.job_id, w.kind)
            elif w.job_id in held:
                # Admitted by an earlier tick into room the quota no longer has: it keeps
                # its place and slot, and waits for room without using up an attempt.
                self.db.scalar(sql.RECORD_SUBMIT_SKIPPED, (w.job_id, held[w.job_id]))
                self.creates_held += 1
            else:
                self.submit(w.job_id, w.kind, w.fireworks_payload or {}, w.gpu_count)

    def _held_for_room(self, pending: list[_Work]) -> dict[uuid.UUID, str]:
        """The due creates the quota just read has no room for, with the reason each waits
        (sftq.creates_that_fit decides). Without a fresh reading nothing shows they fit, so
        all of them wait, as admission does."""
        due = [w for w in pending if w.submit_due and not self._exhausted(w)]
        if not due:
            return {}
        quota = self.quota
        if quota is None or self.auth_failed:
            return {w.job_id: NO_QUOTA_READING for w in due}
        rows = self.db.fetchall(sql.CREATES_THAT_FIT, (
            quota.limit, Decimal(repr(float(quota.usage))),
            float(self.settings.usage_grace_seconds)))
        return {
            job_id: (f"waiting for room in the GPU quota: it needs {gpus} GPUs and the quota "
                     f"read now leaves {max(free, 0)} free for it (usage {float(quota.usage):g} "
                     f"of {quota.limit}); the create is sent once it fits")
            for job_id, gpus, free, fits in rows if not fits
        }

    def submit(self, job_id: uuid.UUID, kind: str, payload: dict[str, Any], gpu_count: int) -> None:
        pid = provider_job_id(job_id)
        try:
            pj = self.provider.create_job(kind, pid, payload, gpu_count=gpu_count)
        except AlreadyExists:
            # An earlier attempt reached the provider (its answer was lost, or its tick
            # died): adopt that job instead of making a second one.
            self._adopt(job_id, kind, pid)
            return
        except AuthError as exc:
            if self.refused(exc, f"submit {job_id}"):
                # The account is fine: the provider refuses this job's payload (a model or
                # dataset it may not use). Permanent, with the provider's body verbatim.
                self._rejected(job_id, exc)
            else:
                self._submit_failed(job_id, kind, exc, "create")
            return
        except Rejected as exc:
            self._rejected(job_id, exc)
            return
        except RateLimited as exc:
            # Not an attempt: the job keeps its place, its id and every attempt it had.
            self.db.scalar(sql.RECORD_SUBMIT_SKIPPED, (job_id, _short(f"{RATE_LIMITED}: {exc}")))
            self.provider_failed(exc, f"submit {job_id}")
            return
        except ProviderError as exc:
            # Transient, or an answer we cannot classify: the job keeps its place and its id.
            self._submit_failed(job_id, kind, exc, "create")
            return
        self.provider_ok()
        self._record_submitted(job_id, kind, pid, pj, adopted=False)

    def _adopt(self, job_id: uuid.UUID, kind: str, pid: str) -> None:
        try:
            pj = self.provider.get_job(kind, pid)
        except ProviderNotFound as exc:
            # 409 then 404: the conflict was not our job existing (or it vanished between
            # the two answers). Never "deleted outside the queue": a job that never ran
            # must not end CANCELLED. Retry the create like any transient failure.
            self._submit_failed(job_id, kind, exc, "create answered 409, then GET 404")
            return
        except AuthError as exc:
            self.refused(exc, f"submit {job_id}: adopt")
            self._submit_failed(job_id, kind, exc, "adopt")
            return
        except ProviderError as exc:
            self._submit_failed(job_id, kind, exc, "adopt")
            return
        self.provider_ok()
        self._record_submitted(job_id, kind, pid, pj, adopted=True)

    def last_check(self, job_id: uuid.UUID, kind: str) -> None:
        """Out of attempts or time: does a provider job exist under the id after all (an
        answer lost on the way back)? Adopt it; if not, give up on the job.

        A check that cannot be made (5xx, a timeout, a 401/403 for this job while the
        account answers) is retried under the backoff, a few times only: then the job gives
        up too, saying so (sftq.record_submit_failure keeps the count and the bound). Bad
        credentials for the whole account decide nothing and change no job (refused()
        raises _ProviderDown).
        """
        pid = provider_job_id(job_id)
        try:
            pj = self.provider.get_job(kind, pid)
        except ProviderNotFound:
            self.provider_ok()
            state = self.call(sql.GIVE_UP_SUBMISSION, (job_id,), f"submit {job_id}: give up")
            if self.ended(job_id, state):
                self.gave_up += 1
            return
        except AuthError as exc:
            if self.refused(exc, f"submit {job_id}: last check"):
                self.error(f"submit {job_id}: last check refused for this job: {exc}")
            self._check_failed(job_id, exc)
            return
        except RateLimited as exc:
            # Cannot tell yet, and no fault of the job's: not counted against its checks.
            self.provider_failed(exc, f"submit {job_id}: last check")
            return
        except ProviderError as exc:
            # Cannot tell yet: a later tick checks again (never a second create).
            self.provider_failed(exc, f"submit {job_id}: last check")
            self._check_failed(job_id, exc)
            return
        self.provider_ok()
        self._record_submitted(job_id, kind, pid, pj, adopted=True)

    def _check_failed(self, job_id: uuid.UUID, exc: ProviderError) -> None:
        # Recorded as a failure with no create attempt left (max attempts 0): the database
        # counts it as a final check that could not be made, backs off, and at its bound
        # ends the job FAIL retryable with this answer as the reason.
        s = self.settings
        answer = _as_dict(self.call(
            sql.RECORD_SUBMIT_FAILURE,
            (job_id, _short(str(exc)), True, 0, s.submit_max_seconds, s.submit_backoff_seconds),
            f"submit {job_id}: last check"))
        if self.ended(job_id, answer.get("state")):
            self.gave_up += 1

    def _record_submitted(self, job_id: uuid.UUID, kind: str, pid: str, pj: ProviderJob, *,
                          adopted: bool) -> None:
        name = pj.name or f"accounts/{self.provider.account_id}/{KIND_COLLECTION[kind]}/{pid}"
        answer = self.call(sql.RECORD_SUBMITTED, (job_id, name, pj.state, adopted),
                           f"submit {job_id}")
        if answer is None:
            return
        self.submitted += 1
        self._created += 1
        if answer == "stop":
            # A cancel arrived while the create was in flight: stop it right away.
            self._stop_and_complete(job_id, kind, pid, submitted=True, after_create=True)
            return
        # An adopted job may have run for a while (or even ended): record what the provider
        # says of it like any reconcile. A fresh create's answer is its first state, which
        # record_submitted stored already.
        if adopted and pj.state is not None:
            answer2 = _as_dict(self.call(sql.OBSERVE_PROVIDER_JOB,
                                         (job_id, json.dumps(observation(pj))),
                                         f"submit {job_id}"))
            if self.ended(job_id, answer2.get("state")):
                self.reconciled += 1

    def _rejected(self, job_id: uuid.UUID, exc: ProviderError) -> None:
        self.provider_ok()
        body = exc.body or str(exc)
        s = self.settings
        answer = _as_dict(self.call(
            sql.RECORD_SUBMIT_FAILURE,
            (job_id, body, False, s.submit_max_attempts, s.submit_max_seconds,
             s.submit_backoff_seconds), f"submit {job_id}"))
        self.ended(job_id, answer.get("state"))

    def _submit_failed(self, job_id: uuid.UUID, kind: str, exc: ProviderError, what: str) -> None:
        self.provider_failed(exc, f"submit {job_id}: {what}")
        s = self.settings
        message = _short(f"{what}: {exc}" if what != "create" else str(exc))
        answer = _as_dict(self.call(
            sql.RECORD_SUBMIT_FAILURE,
            (job_id, message, True, s.submit_max_attempts, s.submit_max_seconds,
             s.submit_backoff_seconds), f"submit {job_id}"))
        if answer.get("exhausted") and not self._provider_down:
            self.last_check(job_id, kind)

    # -- phase 8: admission -------------------------------------------------------------

    def admit(self) -> list[dict[str, Any]]:
        quota = self.quota
        if quota is None or self.auth_failed:
            return []
        # Decimal, not float: the procedure takes numeric, and float8 -> numeric is not
        # an implicit cast, so a float would not resolve the function.
        usage = Decimal(repr(float(quota.usage)))
        answer = _as_dict(self.db.scalar(
            sql.ADMIT_FOR_QUOTA, (quota.limit, usage, float(self.settings.usage_grace_seconds))))
        self.budget = answer.get("budget")
        self.ours_total = answer.get("ours_total")
        self.ours_recent = answer.get("ours_recent")
        jobs: list[dict[str, Any]] = list(answer.get("jobs") or [])
        self.admitted = [str(j["job_id"]) for j in jobs]
        return jobs

    def submit_admitted(self, jobs: Iterable[dict[str, Any]]) -> None:
        for job in jobs:
            job_id = uuid.UUID(str(job["job_id"]))
            if job_id in self.done:
                continue
            self.lease.keep()
            if self._provider_down:
                # Admitted but not tried: say why on the job; the next tick submits it.
                self.db.scalar(sql.RECORD_SUBMIT_SKIPPED, (job_id, self._why_not_attempted()))
                continue
            try:
                self.submit(job_id, str(job["kind"]), dict(job.get("fireworks_payload") or {}),
                            int(job["gpu_count"]))
            except _ProviderDown:
                # Its own create found the credentials refused: it waits, with the reason
                # (no attempt counted), like the jobs after it.
                self.db.scalar(sql.RECORD_SUBMIT_SKIPPED, (job_id, self._why_not_attempted()))

    def _why_not_attempted(self) -> str:
        if self.auth_failed:
            return AUTH_REFUSED
        if self.backoff_until is not None:
            return _short(f"{RATE_LIMITED}: the create is sent once its Retry-After ends")
        return NOT_ATTEMPTED

    # -- phase 10: the second quota reading ---------------------------------------------

    def reread_quota(self) -> None:
        if self._created == 0 or self.quota is None or self._provider_down:
            return
        try:
            after = self.provider.get_quota()
        except AuthError as exc:
            self._credentials_refused(exc, "quota (after creates)")
        except ProviderError as exc:
            # Without it our new jobs are simply counted on top of usage for longer.
            self.provider_failed(exc, "quota (after creates)")
            return
        self.provider_ok()
        self.usage_after = after.usage
        answer = _as_dict(self.db.scalar(sql.RECORD_USAGE_READING, (
            Decimal(repr(float(self.quota.usage))), Decimal(repr(float(after.usage))),
            float(self.settings.usage_grace_seconds))))
        self.usage_counted_gpus = int(answer.get("counted_gpus") or 0)

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
            "queue_timeouts": self.queue_timeouts,
            "gave_up": self.gave_up,
            "preflight_checked": self.preflight_checked,
            "preflight_failed": self.preflight_failed,
            "provider_backoff_until": _iso(self.backoff_until),
            "creates_held": self.creates_held,
            "unknown_states": self.unknown_states,
            "provider_auth_failed": self.auth_failed,
            "usage_after": self.usage_after,
            "usage_counted_gpus": self.usage_counted_gpus,
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
    counts_before = dict(provider.call_counts)
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
    result["provider_requests"] = _calls_since(counts_before, provider.call_counts)
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


def _calls_since(before: dict[tuple[str, str], int],
                 now: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    """This tick's provider calls by (call, status); tick_finish adds them to
    sftq_provider_requests_total (sql/procedures/170_metrics.sql)."""
    return [{"call": call, "status": status, "count": n - before.get((call, status), 0)}
            for (call, status), n in sorted(dict(now).items())
            if n > before.get((call, status), 0)]


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat()


def _phases(tick: _Tick) -> None:
    rows = tick.db.fetchall(sql.SCHEDULER_WORK)
    work = [_Work(*row) for row in rows]
    until = tick.db.scalar(sql.PROVIDER_BACKOFF_UNTIL)
    if until is not None:
        # An earlier tick was told to wait (429 Retry-After) until then: no provider call
        # before it; what needs only the database still runs.
        tick.backoff_until = until.timestamp()
        tick._trip(f"rate limited: the provider's Retry-After runs until "
                   f"{until.astimezone(UTC).isoformat(timespec='seconds')}")
    for phase in (tick.reconcile, tick.finish_cancels, tick.expire_queued, tick.preflight,
                  tick.read_quota, tick.retry_submissions):
        tick.lease.keep(force=True)
        # A provider that gave up ends the phase, not the tick: later phases still record
        # what they can, and each checks the breaker before calling out.
        with contextlib.suppress(_ProviderDown):
            phase(work)
    tick.lease.keep(force=True)
    tick.submit_admitted(tick.admit())
    with contextlib.suppress(_ProviderDown):
        tick.reread_quota()
    tick.lease.keep(force=True)
    # The queue's stretch counts (sql/procedures/062_queue_buckets.sql), in a transaction of
    # their own: the seal holds the admission gate exclusively, briefly, after admission.
    tick.db.scalar(sql.QUEUE_SEAL)


def _finish(db: Database, tick: _Tick, result: dict[str, Any]) -> None:
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
        result["errors"].append(_short(f"database: could not record the tick: {exc.message}"))
        result["status"] = "error"
