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

import time
from dataclasses import dataclass, field
from typing import Any

from sftq_server.preflight.shape import Finding
from sftq_server.provider import (
    AuthError,
    FireworksClient,
    NotFound,
    ProviderError,
    RateLimited,
    Rejected,
)

# Where each kind names its resources: (path in the payload, collection).
_REFS: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "SFT": ((("dataset",), "datasets"), (("evaluationDataset",), "datasets"),
            (("baseModel",), "models"), (("warmStartFrom",), "models")),
    "DPO": ((("dataset",), "datasets"), (("evaluationDataset",), "datasets"),
            (("trainingConfig", "baseModel"), "models"),
            (("trainingConfig", "warmStartFrom"), "models")),
    "RFT": ((("dataset",), "datasets"), (("evaluationDataset",), "datasets"),
            (("evaluator",), "evaluators"),
            (("trainingConfig", "baseModel"), "models"),
            (("trainingConfig", "warmStartFrom"), "models")),
}
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


def references(client: FireworksClient, kind: str, payload: dict[str, Any]) -> list[Ref]:
    """The resources a payload names, in full (a bare id is our account's), each once. A
    value the API could not address is left to the shape check and to Fireworks."""
    refs: list[Ref] = []
    seen: set[str] = set()
    for keys, collection in _REFS.get(kind, ()):
        value: Any = payload
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        name = client.resource_name(collection, value) if isinstance(value, str) else None
        if name is None or name in seen:
            continue
        seen.add(name)
        refs.append(Ref("fireworks_payload." + ".".join(keys), collection, name))
    return refs


# What one GET learned, kept per name for a tick's other jobs: ("missing" | "doubtful" |
# "ok" | "unanswered", the resource's state or the error's message).
Outcome = tuple[str, str]


def check_resources(client: FireworksClient, kind: str, payload: dict[str, Any],
                    gpu_count: int | None = None, *, budget_seconds: float,
                    cache: dict[str, Outcome] | None = None,
                    estimate: bool = True) -> ResourceReport:
    """Every provider check of one job within `budget_seconds` (each call's timeout is what
    is left of it). `cache` shares answers between the jobs of one tick; without `estimate`
    no cost is asked (of a payload Fireworks would refuse anyway)."""
    report = ResourceReport()
    deadline = time.monotonic() + budget_seconds
    for ref in references(client, kind, payload):
        outcome = cache.get(ref.name) if cache is not None else None
        if outcome is None:
            outcome = _look(client, ref, deadline, report)
            if cache is not None and outcome[0] != "unanswered":
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
            return report
    if estimate and kind == "SFT" and not report.errors and report.rate_limited is None:
        report.estimated_cost = _estimate(client, payload, gpu_count, deadline, report)
    return report


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
    except RateLimited as exc:
        report.rate_limited = exc
        report.failures.append(exc)
    except ProviderError:
        pass  # no figure: a cost estimate is never a reason to refuse or to wait
    return None
