"""Phase 3b, run limits (issue 53): stop the running jobs past their max_run_seconds (or the
deployment's SFTQ_MAX_RUN_SECONDS), and flag the ones whose provider progress stood still for
SFTQ_STALL_SECONDS.

The database decides both (sftq.run_limits, sql/procedures/205_run_limits.sql): a job past its
bound gets its cancel recorded with the reason run_timeout, exactly as a user's cancel of a
running job is recorded, and this phase stops it through the cancel path (DELETE for SFT/DPO,
:cancel for RFT), which ends it CANCELLED with a run_timeout event. A stop that fails leaves the
cancel recorded, and the next tick's cancel phase finishes it. A stalled job gets one stalled
event and nothing else: it is not cancelled.
"""

from __future__ import annotations

from sftq_server import db as sql
from sftq_server.provider import provider_job_id
from sftq_server.scheduler.tick.cancels import stop_and_complete
from sftq_server.scheduler.tick.context import Tick, Work, logger


def run_limits(tick: Tick, work: list[Work]) -> None:
    s = tick.settings
    rows = tick.db.fetchall(sql.RUN_LIMITS, (s.max_run_seconds, s.stall_seconds))
    for job_id, kind, job_name, action in rows:
        if action == "stalled":
            logger.warning("job %s: no progress at the provider for %s s (stalled)",
                           job_id, s.stall_seconds)
            continue
        tick.lease.keep()
        # The breaker: a provider given up on ends the phase; the cancels stay recorded.
        tick.check_provider()
        pid = job_name.rsplit("/", 1)[-1] if job_name else provider_job_id(job_id)
        # One job's fault (any exception) is recorded on it; the others are still stopped.
        with tick.job(job_id, "cancel", kind):
            stop_and_complete(tick, job_id, kind, pid, submitted=True)
