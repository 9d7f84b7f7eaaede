"""What one tick carries from phase to phase: its lease, the rows it works on, the per-tick
breaker in front of the provider, and the bookkeeping that becomes the tick's answer.

Every phase module (reconcile, cancels, preflight, quota, submit) takes a `Tick` and the
tick's `Work` rows; none of them holds state of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sftq_server import db as sql
from sftq_server.core.errors import Conflict, NotFound, SftqError, Unavailable
from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.provider import (
    AuthError,
    BudgetSpent,
    FireworksClient,
    ProviderError,
    ProviderJob,
    Quota,
    RateLimited,
    Rejected,
    provider_job_id,
)

# One logger for the whole tick, named after the package (operators filter on it).
logger = logging.getLogger(__package__)

# After this many transient provider failures in a row the tick stops calling the provider:
# during an outage each call costs a full timeout, and the next tick retries everything anyway.
MAX_CONSECUTIVE_TRANSIENT = 4
# A Retry-After is honoured across ticks up to this long.
MAX_BACKOFF_SECONDS = 900.0
# The tick row and the HTTP answer carry short error strings, not a log.
MAX_ERRORS = 50
MAX_ERROR_CHARS = 300

TERMINAL = frozenset({"SUCCESS", "FAIL", "CANCELLED"})
NOT_ATTEMPTED = "not attempted: the provider failed several calls in a row"
AUTH_REFUSED = "not attempted: the provider refused our credentials (401/403 on the account)"
RATE_LIMITED = "not attempted: the provider is rate limiting us"
BUDGET_DEFERRED = ("not attempted: the deployment's provider budget (FIREWORKS_RPM, shared by "
                   "every process) had no slot left this tick; the next tick sends the create")
NO_QUOTA_READING = ("not attempted: no quota reading this tick, so nothing shows the job still "
                    "fits; the create is sent once a reading does")


class LeaseLost(Exception):
    """The lease could not be renewed: it expired, and another tick may own the queue now."""


class ProviderDown(Exception):
    """The tick gave up on the provider for the rest of this tick."""


# SQLSTATE classes that speak of the database itself, not of one job: a lost connection
# (08), no resources (53), an operator's shutdown (57), a system error (58, XX), and a
# deployment that does not match the code (42: a missing procedure, a missing grant).
# They end the tick, as before; any other error while handling a job is that job's fault.
DATABASE_WIDE_SQLSTATE = ("08", "42", "53", "57", "58", "XX")


# The keys whose values are secrets, as sql/procedures/000_common.sql's sftq.redact_secrets
# reads them: an error that quotes a payload must not carry them into an event, the tick's
# answer and row, or the log.
SECRET_KEY = re.compile(r"apikey|api_key|secret|token|password")


def secret_values(value: Any) -> set[str]:
    """The text of every value under a secret-looking key of a payload, at any depth."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if SECRET_KEY.search(str(key).lower()):
                if isinstance(item, dict | list):
                    found |= _leaves(item)
                elif item is not None and str(item):
                    found.add(str(item))
            else:
                found |= secret_values(item)
    elif isinstance(value, list):
        for item in value:
            found |= secret_values(item)
    return found


def _leaves(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set().union(*(_leaves(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_leaves(v) for v in value)) if value else set()
    return {str(value)} if value is not None and str(value) else set()


def redact(text: str, secrets: set[str]) -> str:
    """`text` with every secret value replaced (the longest first; very short values are
    left alone, they would redact ordinary words)."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "[REDACTED]")
    return text


def tick_wide(exc: BaseException) -> bool:
    """Whether an error raised while handling one job must end the phase or the tick rather
    than be recorded on the job: the lease, the provider breaker, or the database gone."""
    if isinstance(exc, LeaseLost | ProviderDown | Unavailable):
        return True
    if isinstance(exc, SftqError):
        sqlstate = str(getattr(exc.__cause__, "sqlstate", None) or "")
        return sqlstate[:2] in DATABASE_WIDE_SQLSTATE
    return False


class Work(NamedTuple):
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


class Lease:
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
            raise LeaseLost
        self._renewed = time.monotonic()


def short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def as_dict(answer: Any) -> dict[str, Any]:
    if isinstance(answer, str):
        answer = json.loads(answer)
    return dict(answer) if isinstance(answer, dict) else {}


def iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat()


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
class Tick:
    db: Database
    provider: FireworksClient
    settings: Settings
    lease: Lease
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
    # Provider jobs created (or adopted) this tick: the quota is read again after creates.
    created: int = 0
    # The per-tick breaker: no more provider calls this tick once it is open.
    provider_down: bool = False
    # Jobs the pre-flight ended, and checked with an answer.
    preflight_failed: int = 0
    preflight_checked: int = 0
    # The end of a 429's Retry-After (epoch seconds) this tick met or started inside.
    backoff_until: float | None = None
    # Calls the deployment's provider budget had no slot for (not sent; the next tick makes
    # them): normal operation at a low FIREWORKS_RPM, noted, not an error.
    budget_deferred: int = 0
    notes: list[str] = field(default_factory=list)
    # Per-job faults (Tick.job): what the answer lists, the jobs with a run of faults going
    # when the tick began, and the jobs this tick handled without a fault, or with one.
    job_errors: list[dict[str, Any]] = field(default_factory=list)
    fault_runs: set[uuid.UUID] = field(default_factory=set)
    handled: set[uuid.UUID] = field(default_factory=set)
    faulted: set[uuid.UUID] = field(default_factory=set)
    # The account probe after a 401/403 on a job: run at most once per tick.
    _probed: bool = False
    _probe_ok: bool = False
    _transient_streak: int = 0
    _dropped_errors: int = 0

    # -- bookkeeping --------------------------------------------------------------------

    def error(self, text: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(short(text))
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

    # -- one job's handling, isolated from the others ----------------------------------

    @contextlib.contextmanager
    def job(self, job_id: uuid.UUID, phase: str, kind: str | None = None,
            payload: Any = None) -> Iterator[None]:
        """Handle one job: whatever goes wrong inside (any exception: a bug, an odd name,
        an answer nobody expected) is recorded on this job and the tick goes on with the
        others. What concerns the whole tick (tick_wide) still ends the phase or the tick.
        `payload` is the job's fireworks_payload: its secrets are kept out of the record."""
        try:
            yield
        except Exception as exc:
            if tick_wide(exc):
                raise
            self.job_fault(job_id, phase, exc, kind, secret_values(payload))
        else:
            self.handled.add(job_id)

    def job_fault(self, job_id: uuid.UUID, phase: str, exc: Exception,
                  kind: str | None = None, secrets: frozenset[str] | set[str] = frozenset()
                  ) -> None:
        """Record one job's fault (sftq.record_job_fault: a tick_error event, and at
        SFTQ_JOB_FAULT_LIMIT ticks in a row the job ends FAIL permanent)."""
        secrets = set(secrets)
        error = short(redact(f"{type(exc).__name__}: {exc}", secrets))
        trace = redact("".join(traceback.format_exception(exc)), secrets)
        logger.warning("tick %s: %s %s failed: %s\n%s", self.lease.tick_id, phase, job_id,
                       error, trace.rstrip())
        self.error(f"{phase} {job_id}: {error}")
        self.faulted.add(job_id)
        entry: dict[str, Any] = {"job_id": str(job_id), "phase": phase, "error": error,
                                 "ended": False}
        if len(self.job_errors) < MAX_ERRORS:
            self.job_errors.append(entry)
        try:
            answer = as_dict(self.db.scalar(sql.RECORD_JOB_FAULT, (
                job_id, self.lease.tick_id, phase, type(exc).__name__, error,
                self.settings.job_fault_limit)))
        except SftqError as db_exc:
            if tick_wide(db_exc):
                raise
            self.error(f"{phase} {job_id}: could not record the fault: {db_exc.message}")
            return
        if not answer.get("ended"):
            return
        entry["ended"] = True
        self.ended(job_id, "FAIL")
        if answer.get("submitted") and kind is not None:
            self._stop_after_fault(job_id, kind, str(answer.get("fireworks_job_name") or ""))

    def _stop_after_fault(self, job_id: uuid.UUID, kind: str, name: str) -> None:
        # The job ended FAIL while its provider job may still run: stop that job once, as a
        # cancel would. Nothing will look at it again, so say so when the stop cannot go.
        pid = name.rsplit("/", 1)[-1] if name else provider_job_id(job_id)
        if self.provider_down:
            self.error(f"stop {job_id}: not attempted (the provider is not being called this "
                       f"tick); provider job {pid} may still be running")
            return
        try:
            self.provider.stop_job(kind, pid)
        except Exception as exc:  # noqa: BLE001 - one more fault of a job that has ended
            if isinstance(exc, ProviderError):
                self.provider_failed(exc, f"stop {job_id}")
            self.error(f"stop {job_id}: provider job {pid} may still be running: "
                       f"{type(exc).__name__}: {exc}")
        else:
            self.provider_ok()

    def faults_cleared(self) -> list[uuid.UUID]:
        """The jobs whose run of faults this tick ended: handled without a fault."""
        return sorted(j for j in self.fault_runs if j in self.handled and j not in self.faulted)

    # -- the provider, with a per-tick breaker ------------------------------------------

    def check_provider(self) -> None:
        if self.provider_down:
            raise ProviderDown

    def provider_ok(self) -> None:
        self._transient_streak = 0

    def provider_failed(self, exc: ProviderError, what: str) -> None:
        """Record a failed call; stop calling the provider once it looks down, or at once
        when it asks us to slow down (429)."""
        if isinstance(exc, BudgetSpent):
            # Not sent, and no answer of the provider's: the budget every process shares has
            # no slot for the tick now. No Retry-After to keep and nothing failed; the rest
            # of this tick's calls wait for the next tick, which is the retry.
            self.budget_deferred += 1
            if len(self.notes) < MAX_ERRORS:
                self.notes.append(short(f"{what}: {exc}"))
            if not self.provider_down:
                self.provider_down = True
                self.notes.append("provider budget: no slot left for the tick; no more "
                                  "provider calls this tick")
            return
        self.error(f"{what}: {exc}")
        if isinstance(exc, RateLimited):
            self.rate_limited(exc)
            return
        if isinstance(exc, Rejected):
            self._transient_streak = 0
            return
        self._transient_streak += 1
        if self._transient_streak >= MAX_CONSECUTIVE_TRANSIENT:
            self.trip(f"{self._transient_streak} transient failures in a row")

    def rate_limited(self, exc: RateLimited) -> None:
        """A 429: no more provider calls this tick, nor before its Retry-After ends."""
        wait = exc.retry_after if exc.retry_after is not None else self.provider.quiet_for
        if wait:
            until = time.time() + min(wait, MAX_BACKOFF_SECONDS)
            self.backoff_until = max(self.backoff_until or 0.0, until)
        self.trip("rate limited (HTTP 429)" + (f"; Retry-After {wait:g} s" if wait else ""))

    def trip(self, why: str) -> None:
        """Open the breaker: no more provider calls this tick."""
        if not self.provider_down:
            self.provider_down = True
            self.error(f"provider: {why}; no more provider calls this tick")

    def refused(self, exc: AuthError, what: str) -> bool:
        """A 401/403 on a call about one job: is it the job, or our credentials?

        Probes an account-level call (the quota read) right then, once per tick. Answers
        True when the account is fine, so the refusal concerns this job alone. When the
        probe is refused too, the credentials are bad: the tick flags it, makes no more
        provider calls and raises ProviderDown, changing no job. A probe that fails
        otherwise decides nothing: the caller treats the refusal as a transient failure.
        """
        if self.auth_failed:
            raise ProviderDown
        if not self._probed:
            self._probed = True
            try:
                self.provider.get_quota()
            except AuthError as probe:
                self.credentials_refused(probe, f"{what}: account probe")
            except ProviderError as probe:
                self.provider_failed(probe, f"{what}: account probe after HTTP {exc.status}")
            else:
                self.provider_ok()
                self.auth_failed = False
                self._probe_ok = True
        return self._probe_ok

    def credentials_refused(self, exc: AuthError, what: str) -> None:
        """The account itself is refused: flag it, open the breaker, raise ProviderDown."""
        self.auth_failed = True
        self.error(f"{what}: provider_auth_failed: {exc}")
        self.trip("provider_auth_failed: the provider refused our credentials")
        raise ProviderDown

    def why_not_attempted(self) -> str:
        """Why an admitted job's create was not sent this tick (the breaker is open)."""
        if self.auth_failed:
            return AUTH_REFUSED
        if self.backoff_until is not None:
            return short(f"{RATE_LIMITED}: the create is sent once its Retry-After ends")
        if self.budget_deferred:
            return BUDGET_DEFERRED
        return NOT_ATTEMPTED

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
            "provider_backoff_until": iso(self.backoff_until),
            "creates_held": self.creates_held,
            "unknown_states": self.unknown_states,
            "provider_auth_failed": self.auth_failed,
            "usage_after": self.usage_after,
            "usage_counted_gpus": self.usage_counted_gpus,
            "errors": errors,
            "job_errors": list(self.job_errors),
            "budget_deferred": self.budget_deferred,
            "notes": list(self.notes),
            "provider_calls": provider_calls,
            "duration_ms": duration_ms,
        }
