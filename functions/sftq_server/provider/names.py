"""Fireworks resource names and ids: which collection each job kind lives in, the ids we
derive for our jobs, and the whole-name check of the datasets, models and evaluators a payload
names (every name that reaches a URL path goes through here first)."""

from __future__ import annotations

import re
import uuid

KIND_COLLECTION: dict[str, str] = {
    "SFT": "supervisedFineTuningJobs",
    "DPO": "dpoJobs",
    "RFT": "reinforcementFineTuningJobs",
}
ID_PARAM: dict[str, str] = {
    "SFT": "supervisedFineTuningJobId",
    "DPO": "dpoJobId",
    "RFT": "reinforcementFineTuningJobId",
}

# The resources a payload names (pre-flight): accounts/{account}/{datasets|models|evaluators}/{id}.
_RESOURCE_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
RESOURCE_RE = re.compile(
    rf"^accounts/([a-z0-9][a-z0-9-]{{0,62}})/(datasets|models|evaluators)/({_RESOURCE_ID})$")


def _resource_match(name: str) -> re.Match[str] | None:
    """A full dataset, model or evaluator name (no '..' segment: it goes into a URL path)."""
    return RESOURCE_RE.match(name) if ".." not in name else None

# Fireworks resource ids: 1-63 of [a-z0-9-], no leading or trailing '-'. Checking ids before
# they go into a URL path also keeps a malformed id from addressing some other resource.
_ID_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


def provider_job_id(job_id: uuid.UUID | str) -> str:
    """The Fireworks job id for one of our jobs: a pure function of our id.

    Deriving it (rather than letting Fireworks pick one) is what makes a retried create safe:
    the second create answers 409 and the caller adopts the existing job (invariant 4).
    "sftq-" + 32 hex digits is 37 chars of [a-z0-9-], valid under Fireworks' id rules.
    """
    parsed = job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
    return "sftq-" + parsed.hex


def _check_kind(kind: str) -> str:
    try:
        return KIND_COLLECTION[kind]
    except KeyError:
        raise ValueError(f"unknown job kind {kind!r}; expected one of SFT, DPO, RFT") from None


def _check_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _ID_RE.match(job_id):
        raise ValueError(f"invalid Fireworks resource id {job_id!r}")
    return job_id

