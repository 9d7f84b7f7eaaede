"""The deployment's one provider budget, kept in PostgreSQL (190_provider_budget.sql).

Fireworks limits the account's requests a minute (FIREWORKS_RPM), whichever process sends
them. `DbBudget` is the provider client's `CallBudget` (sftq_server.provider.budget) for every
process: before each call it takes a slot in one round trip (sftq.provider_budget_take), which
also records how the process's earlier calls ended; a 429 holds every process
(sftq.provider_budget_hold); and it keeps what lookups learned for the other processes
(sftq.provider_lookups). The shares:

- the tick (and a cancel's stop) may use all of FIREWORKS_RPM;
- users' lookups (pre-flight at enqueue, POST /jobs:validate, MCP) only what is left outside
  the tick's reserve (SFTQ_PROVIDER_TICK_RESERVE), and each user only SFTQ_PROVIDER_USER_SHARE
  of that. A lookup that finds its share spent is not sent and never waits: the job is
  accepted and the tick checks it later.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from sftq_server.core.settings import Settings
from sftq_server.db import (
    PROVIDER_BUDGET_FLUSH,
    PROVIDER_BUDGET_HOLD,
    PROVIDER_BUDGET_TAKE,
    PROVIDER_LOOKUPS_GET,
    Database,
)
from sftq_server.provider.budget import SOURCES, Grant

logger = logging.getLogger(__name__)

# The tick paces itself within its reserve, but never sleeps longer than this for one slot.
TICK_MAX_WAIT_SECONDS = 2.0
# The window the shares are counted over (the provider's: requests a minute).
WINDOW_SECONDS = 60

_acting: ContextVar[tuple[str, bytes] | None] = ContextVar("sftq_budget_acting", default=None)


class DbBudget:
    """A process's handle on the deployment's provider budget (see the module docstring).

    `source` is the process's label (tick for the scheduler); jobs-api names the source and
    the user of each request's lookups with `acting_for`."""

    def __init__(self, db: Database, settings: Settings, source: str) -> None:
        if source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}")
        self.db = db
        self.settings = settings
        self._source = source
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str, str], int] = {}
        self._lookups: dict[str, tuple[str, str]] = {}

    # -- who is calling ---------------------------------------------------------------

    @contextlib.contextmanager
    def acting_for(self, source: str, user: bytes | None) -> Iterator[None]:
        """The calls made inside are `source`'s on behalf of `user` (an API key's hash)."""
        if source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}")
        token = _acting.set((source, user or b""))
        try:
            yield
        finally:
            _acting.reset(token)

    @property
    def source(self) -> str:
        acting = _acting.get()
        return acting[0] if acting is not None else self._source

    @property
    def user(self) -> bytes:
        acting = _acting.get()
        return acting[1] if acting is not None else b""

    @property
    def max_wait(self) -> float:
        return TICK_MAX_WAIT_SECONDS if self.source == "tick" else 0.0

    # -- CallBudget --------------------------------------------------------------------

    def take(self, call: str) -> Grant:
        s = self.settings
        counts, lookups = self._pending()
        try:
            raw = self.db.scalar(PROVIDER_BUDGET_TAKE, (
                self.source, call, self.user, int(s.fireworks_rpm),
                float(s.provider_tick_reserve), float(s.provider_user_share),
                counts, lookups, WINDOW_SECONDS))
        except Exception as exc:
            self._restore(counts, lookups)
            if self.source in ("tick", "cancel"):
                raise  # the client paces the scheduler's calls itself (FireworksClient._take)
            # A user's lookup without a budget answer is not sent: the tick checks it later.
            logger.warning("provider budget unavailable (%s): the lookup is not sent", exc)
            return Grant(ok=False, wait=0.0, why="the provider budget could not be read")
        answer: dict[str, Any] = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
        if answer.get("ok"):
            return Grant(ok=True)
        hold = float(answer.get("hold") or 0.0)
        if hold > 0:
            return Grant(ok=False, hold=hold, why="the provider's Retry-After holds every call")
        return Grant(ok=False, wait=float(answer.get("wait") or 0.0), why=str(answer.get("why")))

    def done(self, call: str, status: str) -> None:
        if self.source == "tick":
            return  # the tick's calls are counted with its record (sftq.tick_finish)
        with self._lock:
            key = (self.source, call, status)
            self._counts[key] = self._counts.get(key, 0) + 1

    def hold(self, seconds: float) -> None:
        counts, lookups = self._pending()
        try:
            self.db.scalar(PROVIDER_BUDGET_HOLD, (float(seconds), counts, lookups))
        except Exception:
            self._restore(counts, lookups)
            raise

    # -- lookups shared between requests and processes (preflight.resources) ----------

    def cached(self, names: list[str]) -> dict[str, tuple[str, str]]:
        ttl = float(self.settings.provider_lookup_ttl_seconds)
        if ttl <= 0 or not names:
            return {}
        raw = self.db.scalar(PROVIDER_LOOKUPS_GET, (list(names), ttl))
        found = json.loads(raw) if isinstance(raw, str) else (raw or {})
        return {name: (str(v[0]), str(v[1])) for name, v in found.items()
                if isinstance(v, list) and len(v) == 2}

    def remember(self, name: str, outcome: tuple[str, str]) -> None:
        if self.settings.provider_lookup_ttl_seconds <= 0:
            return
        with self._lock:
            self._lookups[name] = outcome

    def flush(self) -> None:
        """Record what has not ridden on a take yet (one round trip, only when there is)."""
        counts, lookups = self._pending()
        if counts is None and lookups is None:
            return
        try:
            self.db.scalar(PROVIDER_BUDGET_FLUSH, (counts, lookups))
        except Exception:
            self._restore(counts, lookups)
            raise

    # -- plumbing ------------------------------------------------------------------------

    def _pending(self) -> tuple[str | None, str | None]:
        with self._lock:
            counts, self._counts = self._counts, {}
            lookups, self._lookups = self._lookups, {}
        counts_json = json.dumps([
            {"source": source, "call": call, "status": status, "count": n}
            for (source, call, status), n in sorted(counts.items())]) if counts else None
        lookups_json = json.dumps({k: list(v) for k, v in lookups.items()},
                                  ensure_ascii=False) if lookups else None
        return counts_json, lookups_json

    def _restore(self, counts: str | None, lookups: str | None) -> None:
        with self._lock:
            for row in json.loads(counts) if counts else ():
                key = (row["source"], row["call"], row["status"])
                self._counts[key] = self._counts.get(key, 0) + int(row["count"])
            for name, v in (json.loads(lookups) if lookups else {}).items():
                self._lookups.setdefault(name, (v[0], v[1]))
