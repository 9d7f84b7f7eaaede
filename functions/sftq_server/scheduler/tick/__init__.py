"""The scheduler tick: the only place where the database and the provider meet.

One tick, in order (docs/scheduling.md explains each step and what happens on faults):

 1. take the tick lease (sftq.tick_begin); if another tick holds it, do nothing at all;
 2. read every PROGRESS job (sftq.scheduler_work);
 3. reconcile submitted jobs with the provider's state and progress: a listing per kind
    (pages of 200) when there are more than a few, a GET per job otherwise and for ids a
    listing missed; when a kind's listing fails, GETs for its least recently checked jobs;
 3b. run limits: record the cancel (run_timeout) of jobs running past their max_run_seconds
    and stop them as in 4; one stalled event for jobs whose progress stood still;
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

One module per phase, all working on one `context.Tick` (the lease, the breaker in front of
the provider, the counts that become the answer):

    run        the order above, the lease between phases, the tick's record (1, 2, 11)
    reconcile  3            cancels   4, 5           preflight  5b
    run_limits 3b
    quota      6, 10        submit    7, 8, 9 and the last check before giving up

A new phase is a module of its own with a `phase(tick, work)` function, listed in
`run.PHASES` (or called from `run._phases` after admission).

The database decides (admission, every state change, the failure class); this package only
carries facts between the two sides. Every step is safe to repeat: a tick killed at any
line leaves work that the next tick finds in the database and finishes. No provider call is
retried inside a tick: the next tick, which re-reads the database first, is the retry.

A 429 (over the account's request rate) on any call stops the tick's provider calls; its
Retry-After is recorded with the tick, and the ticks that start before it ends make no
provider call at all. A 429 never costs a job an attempt, so it never fails a job.
"""

from __future__ import annotations

from sftq_server.scheduler.tick.context import (
    MAX_BACKOFF_SECONDS,
    MAX_CONSECUTIVE_TRANSIENT,
    MAX_ERROR_CHARS,
    MAX_ERRORS,
    default_holder,
    observation,
)
from sftq_server.scheduler.tick.preflight import PREFLIGHT_RETRY_SECONDS
from sftq_server.scheduler.tick.reconcile import LIST_PAGE_SIZE, LIST_THRESHOLD
from sftq_server.scheduler.tick.run import run_tick

__all__ = ["LIST_PAGE_SIZE", "LIST_THRESHOLD", "MAX_BACKOFF_SECONDS", "MAX_CONSECUTIVE_TRANSIENT",
           "MAX_ERRORS", "MAX_ERROR_CHARS", "PREFLIGHT_RETRY_SECONDS", "default_holder",
           "observation", "run_tick"]
