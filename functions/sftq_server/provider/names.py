"""Fireworks resource names and ids: which collection each job kind lives in, the ids we
derive for our jobs, and the whole-name check of the datasets, models and evaluators a payload
names (every name that reaches a URL path goes through here first)."""

from __future__ import annotations

import re
import uuid
from urllib.parse import quote

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
# Matched whole (re.fullmatch: `$` would also accept a trailing newline).
_RESOURCE_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_ACCOUNT_ID = r"[a-z0-9][a-z0-9-]{0,62}"
RESOURCE_RE = re.compile(
    rf"accounts/({_ACCOUNT_ID})/(datasets|models|evaluators)/({_RESOURCE_ID})")
RESOURCE_ID_RE = re.compile(_RESOURCE_ID)
# The public models' account: looked up besides the queue's own.
PUBLIC_ACCOUNT = "fireworks"
MAX_RESOURCE_NAME = 200


def resource_match(name: str) -> re.Match[str] | None:
    """A full dataset, model or evaluator name, matched whole (no '..': it goes into a URL
    path, and no control character, '%', '?', '#' or non-ASCII letter can match)."""
    if not isinstance(name, str) or ".." in name:
        return None
    return RESOURCE_RE.fullmatch(name)


def full_resource_name(collection: str, ref: object, account_id: str) -> str | None:
    """The full name of a dataset, model or evaluator a payload refers to, or None when the
    reference is not a valid name of that collection. A bare id is `account_id`'s."""
    if not isinstance(ref, str) or not ref or ".." in ref:
        return None
    if "/" not in ref and RESOURCE_ID_RE.fullmatch(ref):
        ref = f"accounts/{account_id}/{collection}/{ref}"
    match = resource_match(ref)
    return ref if match and match.group(2) == collection else None


def resource_name_problem(collection: str, ref: object) -> str | None:
    """What is wrong with a payload's reference to a dataset, model or evaluator, or None
    when it is a valid name (a full name of that collection or a bare id)."""
    what = collection.removesuffix("s")
    example = f"accounts/<account>/{collection}/<id>"
    rule = (f"a valid {what} name is {example} or a bare <id>; the account is 1-63 of a-z, "
            f"0-9 and '-', the id 1-128 of A-Z, a-z, 0-9, '.', '_' and '-' starting with a "
            f"letter or digit, with no '..'")
    if not isinstance(ref, str):
        return None  # the shape check reports a wrong type
    if len(ref) > MAX_RESOURCE_NAME:
        return f"is {len(ref)} characters long, more than {MAX_RESOURCE_NAME}: {rule}"
    if full_resource_name(collection, ref, "a") is not None:
        return None
    match = resource_match(ref)
    if match is not None:
        return f"names a {match.group(2).removesuffix('s')}, not a {what}: {rule}"
    return f"{ref!r} is not a valid {what} name: {rule}"


def resource_account(name: str) -> str | None:
    """The account of a full resource name (None when it is not one)."""
    match = resource_match(name)
    return match.group(1) if match else None


# Fireworks resource ids: 1-63 of [a-z0-9-], no leading or trailing '-'. Checking ids before
# they go into a URL path also keeps a malformed id from addressing some other resource.
_ID_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def segment(value: str) -> str:
    """One URL path segment, percent-encoded whole ('/', '?', '#', '%' and every byte
    outside the unreserved set): whatever a name holds, it addresses one segment."""
    return quote(value, safe="")


def provider_job_id(job_id: uuid.UUID | str) -> str:
    """The Fireworks job id for one of our jobs: a pure function of our id.

    Deriving it (rather than letting Fireworks pick one) is what makes a retried create safe:
    the second create answers 409 and the caller adopts the existing job (invariant 4).
    "sftq-" + 32 hex digits is 37 chars of [a-z0-9-], valid under Fireworks' id rules.
    """
    parsed = job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
    return "sftq-" + parsed.hex


def check_kind(kind: str) -> str:
    try:
        return KIND_COLLECTION[kind]
    except KeyError:
        raise ValueError(f"unknown job kind {kind!r}; expected one of SFT, DPO, RFT") from None


def check_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _ID_RE.fullmatch(job_id):
        raise ValueError(f"invalid Fireworks resource id {job_id!r}")
    return job_id

