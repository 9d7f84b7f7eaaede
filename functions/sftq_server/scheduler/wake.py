"""When to run a tick before the periodic one: woken admission and reconcile passes.

The queue's own events (a submit, a cancel, a job's end) set the wake flag in the database
at their commit (sql/procedures/210_wake.sql). Whoever fires ticks reads it:

- `sftq ticker` polls `sftq.admission_wake_state()` every POLL_SECONDS (one indexed read of
  three one-row tables) and fires a woken tick as soon as a wake is pending, the lease is
  free and the last tick started at least `early_tick_gap` ago. A wake that lands during a
  tick is still pending when that tick releases the lease, so the next poll fires it.
- On Supabase the poke (cron/schedule_tick.sql) POSTs `{"wake": true}` after the commit that
  set the flag, and again when a tick ends with one pending; scheduler-tick waits out the
  rest of the gap (`WakePlan.wait_before_woken_tick`) before it runs the tick.

Between periodic ticks the ticker also fires a reconcile pass (`{"pass": "reconcile"}`) when
jobs run at the provider and the last tick is older than `reconcile_interval`: the running
jobs' states are read, and admission runs in the same pass when one of them ended.

Both rates come from the account's request rate (FIREWORKS_RPM) and the share of it the tick
may use (its reserve in the provider budget), so early ticks and passes never spend more of
the budget than that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sftq_server import db as sql
from sftq_server.core.settings import Settings

if TYPE_CHECKING:
    from sftq_server.db import Database

# The share of the account's request rate (FIREWORKS_RPM) early ticks and passes plan on:
# the tick's reserve in the provider budget (SFTQ_PROVIDER_TICK_RESERVE, sftq_server.budget),
# which users' lookups can never take, so these passes always find their calls.
# What a woken tick costs beyond the creates it makes (which the periodic tick would make
# anyway): the quota read, and a listing page per kind with running jobs (three kinds).
EARLY_TICK_CALLS = 4
# What a reconcile pass costs: a listing page per kind with running jobs.
RECONCILE_CALLS = 3
# Early ticks and passes spend the tick's reserve only while it keeps this part of itself
# free for the periodic tick (whatever users' lookups do meanwhile, the reserve is the
# tick's): with FIREWORKS_RPM=60 and half of it reserved, early passes stop once the tick has
# made 12 calls in the last minute, and the 30 s tick still finds 18.
PERIODIC_SHARE = 1 / 3
# How often `sftq ticker` reads the wake flag.
POLL_SECONDS = 0.25
# scheduler-tick waits at most this long before a woken tick; a longer gap (a very low
# FIREWORKS_RPM) leaves the wake to the periodic tick.
MAX_WAIT_SECONDS = 10.0

Pass = Literal["tick", "wake", "reconcile"]


def _budget_gap(settings: Settings, calls: int) -> float:
    share = min(1.0, max(0.05, settings.provider_tick_reserve))
    return calls * 60.0 / (max(1, settings.fireworks_rpm) * share)


def early_tick_gap(settings: Settings) -> float:
    """Seconds between the starts of a tick and a woken tick after it, at least."""
    return max(settings.wake_min_gap_seconds, _budget_gap(settings, EARLY_TICK_CALLS))


def reconcile_interval(settings: Settings) -> float:
    """Seconds since the last tick after which a reconcile pass is due (inf: never)."""
    if settings.reconcile_freshness_seconds <= 0:
        return math.inf
    return max(settings.reconcile_freshness_seconds, _budget_gap(settings, RECONCILE_CALLS))


@dataclass(frozen=True)
class WakeState:
    """One read of sftq.admission_wake_state(): ages on the database's clock; and the calls
    the tick made in the provider budget's window (None: no budget to read)."""

    wake_age: float | None
    last_tick_age: float | None
    lease_free: bool
    has_running: bool
    tick_calls: int | None = None

    @classmethod
    def read(cls, db: Database) -> WakeState:
        from sftq_server.core.errors import SftqError

        row = db.fetchone(sql.ADMISSION_WAKE_STATE)
        try:
            used = db.fetchone(sql.PROVIDER_BUDGET_USAGE)
        except SftqError:
            used = None  # no budget to read: early passes are paced by the gaps alone
        tick_calls = None if used is None else int(used[1])
        if row is None:  # the function always answers one row
            return cls(None, None, True, False, tick_calls)
        return cls(None if row[0] is None else float(row[0]),
                   None if row[1] is None else float(row[1]), bool(row[2]), bool(row[3]),
                   tick_calls)


@dataclass(frozen=True)
class WakePlan:
    """What the deployment's settings allow between periodic ticks."""

    event_admission: bool
    gap: float
    reconcile_every: float
    # The tick's reserve of FIREWORKS_RPM in calls a minute (0: no limit known).
    reserve_calls: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> WakePlan:
        share = min(1.0, max(0.0, settings.provider_tick_reserve))
        return cls(settings.event_admission, early_tick_gap(settings),
                   reconcile_interval(settings), int(settings.fireworks_rpm * share))

    def budget_room(self, state: WakeState) -> bool:
        """Whether an early pass leaves the periodic tick its part of the reserve: the tick's
        calls in the last minute, plus two early passes' worth, plus PERIODIC_SHARE of the
        reserve, fit in the reserve. Users' lookups never take the reserve, so what is left
        of it is the periodic tick's however hard users look things up."""
        if state.tick_calls is None or self.reserve_calls <= 0:
            return True
        keep = math.ceil(self.reserve_calls * PERIODIC_SHARE)
        return state.tick_calls + 2 * EARLY_TICK_CALLS + keep <= self.reserve_calls

    def due(self, state: WakeState) -> Pass | None:
        """The pass to fire now, if any: a woken tick first, then a reconcile pass."""
        if not state.lease_free:
            return None  # a tick runs; what it leaves pending is seen once it ends
        if not self.budget_room(state):
            return None  # the periodic tick admits: it keeps its part of the reserve
        since = math.inf if state.last_tick_age is None else state.last_tick_age
        if self.event_admission and state.wake_age is not None and since >= self.gap:
            return "wake"
        if state.has_running and since >= self.reconcile_every:
            return "reconcile"
        return None

    def wait_before_woken_tick(self, state: WakeState) -> float | None:
        """scheduler-tick, POSTed a wake: seconds to wait first (None: leave it to the
        periodic tick, the gap being longer than MAX_WAIT_SECONDS)."""
        since = math.inf if state.last_tick_age is None else state.last_tick_age
        wait = max(0.0, self.gap - since)
        return None if wait > MAX_WAIT_SECONDS else wait
