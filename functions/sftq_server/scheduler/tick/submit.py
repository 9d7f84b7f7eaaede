"""Phases 7 to 9, submissions: retry the creates an earlier tick left unfinished (while they
still fit the quota just read), admit under the exclusive admission gate
(sftq.admit_for_quota), create the admitted jobs at the provider, and, for a job out of
attempts or time, the last check: one GET under its id before giving up on it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from sftq_server import db as sql
from sftq_server.provider import (
    KIND_COLLECTION,
    AlreadyExists,
    AuthError,
    BudgetSpent,
    ProviderError,
    ProviderJob,
    RateLimited,
    Rejected,
    provider_job_id,
)
from sftq_server.provider import NotFound as ProviderNotFound
from sftq_server.scheduler.tick.cancels import stop_and_complete
from sftq_server.scheduler.tick.context import (
    BUDGET_DEFERRED,
    NO_QUOTA_READING,
    RATE_LIMITED,
    ProviderDown,
    Tick,
    Work,
    as_dict,
    observation,
    short,
)


def _exhausted(tick: Tick, w: Work) -> bool:
    s = tick.settings
    # While the provider rate-limits us the clock does not run out on a job: a 429 is
    # never the job's failure (its first other answer starts the bound again).
    rate_limited = (w.last_submit_error or "").startswith(RATE_LIMITED)
    return w.submit_attempts >= s.submit_max_attempts or (
        not rate_limited and w.admitted_seconds is not None
        and w.admitted_seconds >= s.submit_max_seconds)


# -- phase 7: creates an earlier tick left unfinished ---------------------------------------

def retry_submissions(tick: Tick, work: list[Work]) -> None:
    pending = [w for w in work if w.submitted_at is None and w.cancel_requested_at is None
               and w.job_id not in tick.done]
    # Fewest attempts first (a stable sort keeps admission order among equals): a few
    # jobs whose creates keep failing must not use up every tick's failure budget ahead
    # of the others, tick after tick.
    pending.sort(key=lambda w: w.submit_attempts)
    held = _held_for_room(tick, pending)
    for w in pending:
        exhausted = _exhausted(tick, w)
        # Out of attempts or time, the first final check is made at once; one that could
        # not be made waits out the backoff like a create.
        if not w.submit_due and not (exhausted and w.last_check_failures == 0):
            continue  # still in its backoff
        tick.lease.keep()
        tick.check_provider()
        with tick.job(w.job_id, "last_check" if exhausted else "submit", w.kind,
                      w.fireworks_payload):
            if exhausted:
                last_check(tick, w.job_id, w.kind)
            elif w.job_id in held:
                # Admitted by an earlier tick into room the quota no longer has: it keeps
                # its place and slot, and waits for room without using up an attempt.
                tick.db.scalar(sql.RECORD_SUBMIT_SKIPPED, (w.job_id, held[w.job_id]))
                tick.creates_held += 1
            else:
                submit(tick, w.job_id, w.kind, w.fireworks_payload or {}, w.gpu_count)


def _held_for_room(tick: Tick, pending: list[Work]) -> dict[uuid.UUID, str]:
    """The due creates the quota just read has no room for, with the reason each waits
    (sftq.creates_that_fit decides). Without a fresh reading nothing shows they fit, so
    all of them wait, as admission does."""
    due = [w for w in pending if w.submit_due and not _exhausted(tick, w)]
    if not due:
        return {}
    quota = tick.quota
    if quota is None or tick.auth_failed:
        return {w.job_id: NO_QUOTA_READING for w in due}
    rows = tick.db.fetchall(sql.CREATES_THAT_FIT, (
        quota.limit, Decimal(repr(float(quota.usage))),
        float(tick.settings.usage_grace_seconds)))
    return {
        job_id: (f"waiting for room in the GPU quota: it needs {gpus} GPUs and the quota "
                 f"read now leaves {max(free, 0)} free for it (usage {float(quota.usage):g} "
                 f"of {quota.limit}); the create is sent once it fits")
        for job_id, gpus, free, fits in rows if not fits
    }


# -- phase 8: admission ---------------------------------------------------------------------

def admit(tick: Tick) -> list[dict[str, Any]]:
    quota = tick.quota
    if quota is None or tick.auth_failed:
        return []
    # Decimal, not float: the procedure takes numeric, and float8 -> numeric is not
    # an implicit cast, so a float would not resolve the function.
    usage = Decimal(repr(float(quota.usage)))
    answer = as_dict(tick.db.scalar(
        sql.ADMIT_FOR_QUOTA, (quota.limit, usage, float(tick.settings.usage_grace_seconds))))
    tick.budget = answer.get("budget")
    tick.ours_total = answer.get("ours_total")
    tick.ours_recent = answer.get("ours_recent")
    jobs: list[dict[str, Any]] = list(answer.get("jobs") or [])
    tick.admitted = [str(j["job_id"]) for j in jobs]
    return jobs


# -- phase 9: create the admitted jobs ------------------------------------------------------

def submit_admitted(tick: Tick, jobs: Iterable[dict[str, Any]]) -> None:
    for job in jobs:
        job_id = uuid.UUID(str(job["job_id"]))
        if job_id in tick.done:
            continue
        tick.lease.keep()
        if tick.provider_down:
            # Admitted but not tried: say why on the job; the next tick submits it.
            tick.db.scalar(sql.RECORD_SUBMIT_SKIPPED, (job_id, tick.why_not_attempted()))
            continue
        kind = str(job["kind"])
        body = dict(job.get("fireworks_payload") or {})
        try:
            with tick.job(job_id, "submit", kind, body):
                submit(tick, job_id, kind, body, int(job["gpu_count"]))
        except ProviderDown:
            # Its own create found the credentials refused: it waits, with the reason
            # (no attempt counted), like the jobs after it.
            tick.db.scalar(sql.RECORD_SUBMIT_SKIPPED, (job_id, tick.why_not_attempted()))


# -- one create, and what follows from its answer -------------------------------------------

def submit(tick: Tick, job_id: uuid.UUID, kind: str, payload: dict[str, Any],
           gpu_count: int) -> None:
    pid = provider_job_id(job_id)
    try:
        pj = tick.provider.create_job(kind, pid, payload, gpu_count=gpu_count)
    except AlreadyExists:
        # An earlier attempt reached the provider (its answer was lost, or its tick
        # died): adopt that job instead of making a second one.
        _adopt(tick, job_id, kind, pid)
        return
    except AuthError as exc:
        if tick.refused(exc, f"submit {job_id}"):
            # The account is fine: the provider refuses this job's payload (a model or
            # dataset it may not use). Permanent, with the provider's body verbatim.
            _rejected(tick, job_id, exc)
        else:
            _submit_failed(tick, job_id, kind, exc, "create")
        return
    except Rejected as exc:
        _rejected(tick, job_id, exc)
        return
    except RateLimited as exc:
        # Not an attempt: the job keeps its place, its id and every attempt it had.
        why = BUDGET_DEFERRED if isinstance(exc, BudgetSpent) else f"{RATE_LIMITED}: {exc}"
        tick.db.scalar(sql.RECORD_SUBMIT_SKIPPED, (job_id, short(why)))
        tick.provider_failed(exc, f"submit {job_id}")
        return
    except ProviderError as exc:
        # Transient, or an answer we cannot classify: the job keeps its place and its id.
        _submit_failed(tick, job_id, kind, exc, "create")
        return
    tick.provider_ok()
    _record_submitted(tick, job_id, kind, pid, pj, adopted=False)


def _adopt(tick: Tick, job_id: uuid.UUID, kind: str, pid: str) -> None:
    try:
        pj = tick.provider.get_job(kind, pid)
    except ProviderNotFound as exc:
        # 409 then 404: the conflict was not our job existing (or it vanished between
        # the two answers). Never "deleted outside the queue": a job that never ran
        # must not end CANCELLED. Retry the create like any transient failure.
        _submit_failed(tick, job_id, kind, exc, "create answered 409, then GET 404")
        return
    except AuthError as exc:
        tick.refused(exc, f"submit {job_id}: adopt")
        _submit_failed(tick, job_id, kind, exc, "adopt")
        return
    except ProviderError as exc:
        _submit_failed(tick, job_id, kind, exc, "adopt")
        return
    tick.provider_ok()
    _record_submitted(tick, job_id, kind, pid, pj, adopted=True)


def last_check(tick: Tick, job_id: uuid.UUID, kind: str) -> None:
    """Out of attempts or time: does a provider job exist under the id after all (an
    answer lost on the way back)? Adopt it; if not, give up on the job.

    A check that cannot be made (5xx, a timeout, a 401/403 for this job while the
    account answers) is retried under the backoff, a few times only: then the job gives
    up too, saying so (sftq.record_submit_failure keeps the count and the bound). Bad
    credentials for the whole account decide nothing and change no job (refused()
    raises ProviderDown).
    """
    pid = provider_job_id(job_id)
    try:
        pj = tick.provider.get_job(kind, pid)
    except ProviderNotFound:
        tick.provider_ok()
        state = tick.call(sql.GIVE_UP_SUBMISSION, (job_id,), f"submit {job_id}: give up")
        if tick.ended(job_id, state):
            tick.gave_up += 1
        return
    except AuthError as exc:
        if tick.refused(exc, f"submit {job_id}: last check"):
            tick.error(f"submit {job_id}: last check refused for this job: {exc}")
        _check_failed(tick, job_id, exc)
        return
    except RateLimited as exc:
        # Cannot tell yet, and no fault of the job's: not counted against its checks.
        tick.provider_failed(exc, f"submit {job_id}: last check")
        return
    except ProviderError as exc:
        # Cannot tell yet: a later tick checks again (never a second create).
        tick.provider_failed(exc, f"submit {job_id}: last check")
        _check_failed(tick, job_id, exc)
        return
    tick.provider_ok()
    _record_submitted(tick, job_id, kind, pid, pj, adopted=True)


def _check_failed(tick: Tick, job_id: uuid.UUID, exc: ProviderError) -> None:
    # Recorded as a failure with no create attempt left (max attempts 0): the database
    # counts it as a final check that could not be made, backs off, and at its bound
    # ends the job FAIL retryable with this answer as the reason.
    s = tick.settings
    answer = as_dict(tick.call(
        sql.RECORD_SUBMIT_FAILURE,
        (job_id, short(str(exc)), True, 0, s.submit_max_seconds, s.submit_backoff_seconds),
        f"submit {job_id}: last check"))
    if tick.ended(job_id, answer.get("state")):
        tick.gave_up += 1


def _record_submitted(tick: Tick, job_id: uuid.UUID, kind: str, pid: str, pj: ProviderJob, *,
                      adopted: bool) -> None:
    name = pj.name or f"accounts/{tick.provider.account_id}/{KIND_COLLECTION[kind]}/{pid}"
    answer = tick.call(sql.RECORD_SUBMITTED, (job_id, name, pj.state, adopted),
                       f"submit {job_id}")
    if answer is None:
        return
    tick.submitted += 1
    tick.created += 1
    if answer == "stop":
        # A cancel arrived while the create was in flight: stop it right away.
        stop_and_complete(tick, job_id, kind, pid, submitted=True, after_create=True)
        return
    # An adopted job may have run for a while (or even ended): record what the provider
    # says of it like any reconcile. A fresh create's answer is its first state, which
    # record_submitted stored already.
    if adopted and pj.state is not None:
        answer2 = as_dict(tick.call(sql.OBSERVE_PROVIDER_JOB,
                                    (job_id, json.dumps(observation(pj))),
                                    f"submit {job_id}"))
        if tick.ended(job_id, answer2.get("state")):
            tick.reconciled += 1


def _rejected(tick: Tick, job_id: uuid.UUID, exc: ProviderError) -> None:
    tick.provider_ok()
    body = exc.body or str(exc)
    s = tick.settings
    answer = as_dict(tick.call(
        sql.RECORD_SUBMIT_FAILURE,
        (job_id, body, False, s.submit_max_attempts, s.submit_max_seconds,
         s.submit_backoff_seconds), f"submit {job_id}"))
    tick.ended(job_id, answer.get("state"))


def _submit_failed(tick: Tick, job_id: uuid.UUID, kind: str, exc: ProviderError,
                   what: str) -> None:
    tick.provider_failed(exc, f"submit {job_id}: {what}")
    s = tick.settings
    message = short(f"{what}: {exc}" if what != "create" else str(exc))
    answer = as_dict(tick.call(
        sql.RECORD_SUBMIT_FAILURE,
        (job_id, message, True, s.submit_max_attempts, s.submit_max_seconds,
         s.submit_backoff_seconds), f"submit {job_id}"))
    if answer.get("exhausted") and not tick.provider_down:
        last_check(tick, job_id, kind)
