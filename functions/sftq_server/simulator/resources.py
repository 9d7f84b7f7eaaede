"""The simulated account's other resources and its request rate.

- Datasets, models and evaluators, as pre-flight and a create see them. By default every
  name exists and is usable (a dataset READY, an evaluator ACTIVE), so a demo needs no setup;
  `POST /_sim/resources` names some as missing or in another state, and `"known_only": true`
  makes every name not listed missing.
- The account's request rate (`POST /_sim/rate_limit {"rpm": N}`): past N Fireworks-path
  requests in the last minute the simulator answers 429 RESOURCE_EXHAUSTED with a
  Retry-After of the seconds until a request leaves that minute.
"""

from __future__ import annotations

import math
import re
from collections import deque
from typing import Any

from sftq_server.simulator.validation import HttpError, integer

COLLECTIONS = ("datasets", "models", "evaluators")
_NAME_RE = re.compile(
    r"^accounts/[a-z0-9][a-z0-9-]{0,62}/(datasets|models|evaluators)/[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# The states each collection may be set to (Fireworks' enums); the first is the usable one.
STATES: dict[str, tuple[str, ...]] = {
    "datasets": ("READY", "UPLOADING", "STATE_UNSPECIFIED"),
    "models": ("READY", "UPLOADING", "STATE_UNSPECIFIED"),
    "evaluators": ("ACTIVE", "BUILDING", "BUILD_FAILED", "STATE_UNSPECIFIED"),
}
_MAX_RESOURCES = 10_000


class Resources:
    """Which datasets, models and evaluators exist, and in which state."""

    def __init__(self) -> None:
        self.known_only = False
        # name -> state, or None: does not exist.
        self.listed: dict[str, str | None] = {}

    def update(self, body: dict[str, Any]) -> dict[str, Any]:
        unknown = set(body) - {"known_only", "resources", "reset"}
        if unknown:
            raise ValueError(f"unknown fields: {', '.join(sorted(unknown))}")
        if body.get("reset"):
            self.known_only, self.listed = False, {}
        if "known_only" in body:
            if not isinstance(body["known_only"], bool):
                raise ValueError("known_only must be true or false")
            self.known_only = body["known_only"]
        entries = body.get("resources") or {}
        if not isinstance(entries, dict):
            raise ValueError('resources must be an object: {"accounts/a/datasets/d": "READY" '
                             'or null (does not exist)}')
        for name, state in entries.items():
            match = _NAME_RE.match(name)
            if not match:
                raise ValueError(
                    f"{name!r} is not accounts/ACCOUNT/(datasets|models|evaluators)/ID")
            allowed = STATES[match.group(1)]
            if state is not None and state not in allowed:
                raise ValueError(f"{name}: state must be null or one of {', '.join(allowed)}")
        if len(self.listed) + len(entries) > _MAX_RESOURCES:
            raise ValueError(f"at most {_MAX_RESOURCES} resources")
        self.listed.update(entries)
        return self.as_json()

    def as_json(self) -> dict[str, Any]:
        return {"known_only": self.known_only, "resources": dict(self.listed)}

    def state_of(self, name: str) -> str | None:
        """The resource's state, or None when it does not exist."""
        match = _NAME_RE.match(name)
        if not match:
            return None
        if name in self.listed:
            return self.listed[name]
        return None if self.known_only else STATES[match.group(1)][0]

    def get(self, name: str, timestamp: str) -> dict[str, Any]:
        state = self.state_of(name)
        collection = name.split("/")[2]
        if state is None:
            raise HttpError(404, f'{collection[:-1]} "{name}" not found')
        resource: dict[str, Any] = {"name": name, "displayName": name.rsplit("/", 1)[-1],
                                    "createTime": timestamp, "updateTime": timestamp,
                                    "state": state}
        if collection == "datasets":
            resource.update({"format": "CHAT", "exampleCount": "1000"})
        return resource

    def missing_for(self, kind: str, payload: dict[str, Any], account: str) -> str | None:
        """What a create would be refused for: the first resource it names that does not
        exist (None: all there). Names the check cannot read are left to pass."""
        for ref, collection in _refs(kind, payload):
            name = ref if "/" in ref else f"accounts/{account}/{collection}/{ref}"
            if _NAME_RE.match(name) and self.state_of(name) is None:
                return f'{collection[:-1]} "{name}" not found'
        return None


def _refs(kind: str, payload: dict[str, Any]) -> list[tuple[str, str]]:
    training = payload.get("trainingConfig")
    nested = training if isinstance(training, dict) else {}
    holder = payload if kind == "SFT" else nested
    found = [(payload.get("dataset"), "datasets"), (payload.get("evaluationDataset"), "datasets"),
             (holder.get("baseModel"), "models"), (holder.get("warmStartFrom"), "models")]
    if kind == "RFT":
        found.append((payload.get("evaluator"), "evaluators"))
    return [(ref, collection) for ref, collection in found if isinstance(ref, str) and ref]


class RateLimit:
    """The account's requests a minute, counted on the simulator's clock."""

    def __init__(self) -> None:
        self.rpm: int | None = None
        self._sent: deque[float] = deque()
        self.refused = 0

    def update(self, body: dict[str, Any]) -> dict[str, Any]:
        unknown = set(body) - {"rpm"}
        if unknown:
            raise ValueError(f"unknown fields: {', '.join(sorted(unknown))}")
        rpm = body.get("rpm")
        self.rpm = None if rpm is None else integer(rpm, "rpm", minimum=1)
        self._sent.clear()
        return self.as_json()

    def as_json(self) -> dict[str, Any]:
        return {"rpm": self.rpm, "in_last_minute": len(self._sent), "refused": self.refused}

    def admit(self, now: float) -> float | None:
        """None: the request may go (it is counted); else the Retry-After in seconds."""
        if self.rpm is None:
            return None
        while self._sent and self._sent[0] <= now - 60:
            self._sent.popleft()
        if len(self._sent) >= self.rpm:
            self.refused += 1
            return max(0.001, self._sent[0] + 60 - now)
        self._sent.append(now)
        return None


def retry_after_header(seconds: float) -> str:
    # delta-seconds is a whole number in HTTP; round up so a client that honours it is late,
    # never early.
    return str(max(1, math.ceil(seconds)))
