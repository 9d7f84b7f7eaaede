"""Phases 6 and 10, the quota: the live reading admission is sized by, and the second
reading after creates, from which sftq.record_usage_reading learns what the provider's
usage already shows of our new jobs (so they stop being counted twice).
"""

from __future__ import annotations

from decimal import Decimal

from sftq_server import db as sql
from sftq_server.provider import AuthError, ProviderError
from sftq_server.scheduler.tick.context import ProviderDown, Tick, Work, as_dict


def read_quota(tick: Tick, work: list[Work]) -> None:
    # Read even after a run of failed calls: those failures may belong to a few jobs
    # (the provider is otherwise fine), and skipping admission for them would stall the
    # whole queue behind them. A provider that is really down fails this one call too.
    if tick.auth_failed or tick.backoff_until is not None:
        raise ProviderDown  # refused credentials, or a Retry-After still running
    try:
        quota = tick.provider.get_quota()
    except AuthError as exc:
        tick.credentials_refused(exc, "quota")
    except ProviderError as exc:
        # No fresh quota, no admission: the budget must come from the live figure.
        tick.provider_failed(exc, "quota")
        return
    tick.provider_ok()
    tick.provider_down = False
    tick.auth_failed = False
    tick.quota = quota


def reread_quota(tick: Tick) -> None:
    if tick.created == 0 or tick.quota is None or tick.provider_down:
        return
    try:
        after = tick.provider.get_quota()
    except AuthError as exc:
        tick.credentials_refused(exc, "quota (after creates)")
    except ProviderError as exc:
        # Without it our new jobs are simply counted on top of usage for longer.
        tick.provider_failed(exc, "quota (after creates)")
        return
    tick.provider_ok()
    tick.usage_after = after.usage
    answer = as_dict(tick.db.scalar(sql.RECORD_USAGE_READING, (
        Decimal(repr(float(tick.quota.usage))), Decimal(repr(float(after.usage))),
        float(tick.settings.usage_grace_seconds))))
    tick.usage_counted_gpus = int(answer.get("counted_gpus") or 0)
