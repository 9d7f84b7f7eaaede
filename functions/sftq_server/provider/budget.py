"""The hook through which every provider call asks for a slot of the account's request rate.

Fireworks limits the account, not a process: the tick, jobs-api's pre-flight, POST
/jobs:validate and the MCP tools all spend the same FIREWORKS_RPM. The client asks its
`CallBudget` before each call and tells it how each call ended; the implementation that keeps
the one budget of a deployment lives outside this package (it needs the database, which the
provider never imports): `sftq_server.budget.DbBudget`. A client without a budget paces its
own calls to FIREWORKS_RPM, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# The label of each kind of caller, in sftq_provider_requests_total{source}.
SOURCES = ("tick", "preflight", "validate", "mcp", "cancel")


@dataclass(frozen=True)
class Grant:
    """A budget's answer to one call.

    ok: the call may be sent now. Otherwise `hold` > 0 when a 429's Retry-After seen by any
    process still holds every call (seconds left), else the budget is spent for this caller
    and `wait` says when a slot frees (seconds, approximate); `why` says which share is spent.
    """

    ok: bool
    wait: float = 0.0
    hold: float = 0.0
    why: str = ""


class CallBudget(Protocol):
    """What the client needs of a deployment-wide budget."""

    @property
    def source(self) -> str:
        """The caller's label (one of SOURCES) for the calls being made now."""
        ...

    @property
    def max_wait(self) -> float:
        """How long the client may sleep for a slot before it gives up on a call (the tick
        paces within its reserve; users' lookups never wait)."""
        ...

    def take(self, call: str) -> Grant:
        """Ask for one call's slot; a granted slot is spent whether or not the call answers."""
        ...

    def done(self, call: str, status: str) -> None:
        """How a call ended: the HTTP status, `timeout` or `error` (for the metrics)."""
        ...

    def hold(self, seconds: float) -> None:
        """The provider answered 429 with this Retry-After: hold every process's calls."""
        ...
