"""The provider check: do the dataset, evaluator and models a payload names exist at
Fireworks (and what would an SFT job cost)?

Fireworks has no validate-only call for fine-tuning, so this asks what it can read: a GET of
each resource the payload names, and SFT's cost estimate. A 404 is definite (the job would
fail at submission for certain); a resource that exists but is not usable yet (a dataset
still UPLOADING, an evaluator whose build failed) or that our key may not read is doubtful,
since it may change while the job waits. Calls that do not answer in time leave the check
to be made again later (`answered` False): jobs-api at enqueue, within its budget, then the
tick while the job waits. Reads only; nothing is ever created here.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sftq_server.preflight.shape import REFS, Finding
from sftq_server.provider import (
    PUBLIC_ACCOUNT,
    AuthError,
    BudgetSpent,
    FireworksClient,
    NotFound,
    ProviderError,
    RateLimited,
    Rejected,
    resource_account,
)

# A resource's `state` that says it is usable; any other state is reported as a warning.
_USABLE = {"datasets": {"READY"}, "models": {"READY", "STATE_UNSPECIFIED", ""},
           "evaluators": {"ACTIVE", "STATE_UNSPECIFIED", ""}}
_WHAT = {"datasets": "dataset", "models": "model", "evaluators": "evaluator"}


@dataclass(frozen=True)
class Ref:
    path: str        # fireworks_payload.trainingConfig.baseModel
    collection: str  # datasets | models | evaluators
    name: str        # accounts/{account}/datasets/{id}


@dataclass
class ResourceReport:
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    estimated_cost: Any = None
    # Every resource check got an answer (a cost estimate that did not is no reason to ask
    # again). False: the provider failed or was slow; the check is to be made again.
    answered: bool = True
    # The transient failures met (the tick counts them against its breaker).
    failures: list[ProviderError] = field(default_factory=list)
    # The provider asked us to slow down (429): the seconds of its Retry-After, if any.
    rate_limited: RateLimited | None = None
    # Some lookup was not sent: the deployment's provider budget had no slot for it.
    budget_spent: bool = False


def references(client: FireworksClient, kind: str, payload: dict[str, Any]) -> list[Ref]:
    """The resources a payload names, in full (a bare id is our account's), each once. A
    value the API could not address is left to the shape check and to Fireworks."""
    refs: list[Ref] = []
    seen: set[str] = set()
    for keys, collection in REFS.get(kind, ()):
        value: Any = payload
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        name = client.resource_name(collection, value) if isinstance(value, str) else None
        if name is None or name in seen:
            continue
        seen.add(name)
        refs.append(Ref("fireworks_payload." + ".".join(keys), collection, name))
    return refs


def foreign(client: FireworksClient, ref: Ref) -> bool:
    """A resource of an account other than the queue's own and the public models' one: the
    queue's key is never used to look it up (its answers would tell other accounts' 404, 403
    and states apart); Fireworks decides at submission whether the job may use it."""
    return resource_account(ref.name) not in (client.account_id, PUBLIC_ACCOUNT)


# What one GET learned, kept per name for a tick's other jobs: ("missing" | "doubtful" |
# "ok" | "unanswered", the resource's state or the error's message).
Outcome = tuple[str, str]


@runtime_checkable
class SharedLookups(Protocol):
    """Lookups kept across requests and processes (sftq_server.budget.DbBudget): what a GET
    learned of a resource, for a short while."""

    def cached(self, names: list[str]) -> dict[str, Outcome]: ...

    def remember(self, name: str, outcome: Outcome) -> None: ...

    def flush(self) -> None: ...


def check_resources(client: FireworksClient, kind: str, payload: dict[str, Any],
                    gpu_count: int | None = None, *, budget_seconds: float,
                    cache: dict[str, Outcome] | None = None,
                    estimate: bool = True) -> ResourceReport:
    """Every provider check of one job within `budget_seconds` (each call's timeout is what
    is left of it). `cache` shares answers between the jobs of one tick; the client's budget,
    when it keeps lookups (SharedLookups), shares them between requests and processes.
    Without `estimate` no cost is asked (of a payload Fireworks would refuse anyway)."""
    report = ResourceReport()
    deadline = time.monotonic() + budget_seconds
    refs = references(client, kind, payload)
    mine: list[Ref] = []
    for ref in refs:
        if foreign(client, ref):
            report.warnings.append(Finding(ref.path, (
                f"{_WHAT[ref.collection]} {ref.name} belongs to another Fireworks account: the "
                f"queue looks up only its own account's resources and the public ones "
                f"(accounts/{PUBLIC_ACCOUNT}); Fireworks decides at submission whether the "
                f"job may use it")))
        else:
            mine.append(ref)
    budget = getattr(client, "budget", None)
    shared: SharedLookups | None = budget if isinstance(budget, SharedLookups) else None
    known: dict[str, Outcome] = dict(cache or {})
    unknown = [ref.name for ref in mine if ref.name not in known]
    if shared is not None and unknown:
        # A cache that cannot answer is simply not used.
        with contextlib.suppress(Exception):
            known.update(shared.cached(unknown))
    try:
        _check(client, kind, payload, gpu_count, mine, known, cache, shared, deadline,
               estimate, report)
    finally:
        if shared is not None:
            with contextlib.suppress(Exception):  # what is lost is asked again later
                shared.flush()
    return report


def _check(client: FireworksClient, kind: str, payload: dict[str, Any], gpu_count: int | None,
           refs: list[Ref], known: dict[str, Outcome], cache: dict[str, Outcome] | None,
           shared: SharedLookups | None, deadline: float, estimate: bool,
           report: ResourceReport) -> None:
    for ref in refs:
        outcome = known.get(ref.name)
        if outcome is None:
            outcome = _look(client, ref, deadline, report)
            if outcome[0] != "unanswered":
                if cache is not None:
                    cache[ref.name] = outcome
                if shared is not None and outcome[0] != "missing":
                    # A missing resource is not shared: the user may upload it the next
                    # moment, and a refusal must rest on a fresh answer.
                    shared.remember(ref.name, outcome)
        elif cache is not None:
            cache[ref.name] = outcome
        verdict, detail = outcome
        what = _WHAT[ref.collection]
        if verdict == "missing":
            report.errors.append(Finding(ref.path, (
                f"{what} {ref.name} does not exist at Fireworks: create or upload it first, "
                f"or fix the name (the job would fail at submission)")))
        elif verdict == "doubtful":
            report.warnings.append(Finding(ref.path, f"{what} {ref.name}: {detail}"))
        elif verdict == "unanswered":
            report.answered = False
        if report.rate_limited is not None:
            report.answered = False
            return
    if estimate and kind == "SFT" and not report.errors and report.rate_limited is None:
        report.estimated_cost = _estimate(client, payload, gpu_count, deadline, report)


def _left(deadline: float) -> float | None:
    left = deadline - time.monotonic()
    return left if left > 0.05 else None


def _look(client: FireworksClient, ref: Ref, deadline: float, report: ResourceReport) -> Outcome:
    timeout = _left(deadline)
    if timeout is None:
        return "unanswered", "no time left in the pre-flight budget"
    try:
        resource = client.get_resource(ref.name, timeout=min(timeout, client.timeout))
    except NotFound:
        return "missing", "not found"
    except AuthError as exc:
        return "doubtful", (f"the queue's Fireworks key may not read it (HTTP {exc.status}); "
                            "the job fails at submission if Fireworks refuses it then")
    except BudgetSpent as exc:
        # Not sent (the lookup share or this user's share of FIREWORKS_RPM is spent): no
        # failure of the provider's, and the tick checks the job later.
        report.rate_limited = exc
        report.budget_spent = True
        return "unanswered", str(exc)
    except RateLimited as exc:
        report.rate_limited = exc
        report.failures.append(exc)
        return "unanswered", str(exc)
    except Rejected as exc:
        return "doubtful", f"Fireworks would not say whether it exists (HTTP {exc.status})"
    except ProviderError as exc:
        report.failures.append(exc)
        return "unanswered", str(exc)
    state = resource.get("state")
    state = state if isinstance(state, str) else ""
    if state not in _USABLE[ref.collection]:
        if ref.collection == "datasets":
            return "doubtful", (f"it is {state or 'in no state'}, not READY: the job fails at "
                                "submission unless it is READY by the time the job is admitted")
        return "doubtful", f"it is {state}: the job may fail at submission"
    return "ok", state


def _estimate(client: FireworksClient, payload: dict[str, Any], gpu_count: int | None,
              deadline: float, report: ResourceReport) -> Any:
    timeout = _left(deadline)
    if timeout is None:
        return None
    try:
        return client.estimate_cost("SFT", payload, gpu_count=gpu_count,
                                    timeout=min(timeout, client.timeout))
    except BudgetSpent as exc:
        report.rate_limited = exc
        report.budget_spent = True
    except RateLimited as exc:
        report.rate_limited = exc
        report.failures.append(exc)
    except ProviderError:
        pass  # no figure: a cost estimate is never a reason to refuse or to wait
    return None
