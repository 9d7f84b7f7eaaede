"""Injected faults and scripted answers: what the simulator answers instead of itself.

Two mechanisms, set together through `POST /_sim/faults`:
- random faults (`error_rate`, `statuses`, `timeout_rate`, `latency_ms`, `timeout_seconds`),
  drawn from the simulator's seeded generator;
- scripted rules (`rules`): `{"method", "path" (a regex searched in the request path without
  its query string), "status", "body", "times", "headers"}`. The first rule that matches and
  has `times` left answers instead of the simulator (with its `headers`, a Retry-After say);
  without `times` it answers every time. They let a test say exactly which request fails
  and how (a 403 on one job's create, a 409 ABORTED, a 429 with Retry-After: 30).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sftq_server.simulator.validation import error_body, integer, number, rate

DEFAULT_FAULT_STATUSES = (500, 503, 429)
DEFAULT_TIMEOUT_SECONDS = 15.0
# A rule's answer must be a real HTTP status; 1xx and 3xx would confuse every client.
_RULE_STATUSES = range(200, 600)
_RULE_KEYS = frozenset({"method", "path", "status", "body", "times", "headers"})
MAX_RULES = 1000


@dataclass
class Rule:
    """One scripted answer. `times` None: answers every time; else the answers left."""

    path: str
    status: int
    body: Any
    method: str | None = None
    times: int | None = None
    # Extra response headers (a Retry-After of its own, say).
    headers: dict[str, str] = field(default_factory=dict)
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._pattern = re.compile(self.path)

    def matches(self, method: str, path: str) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.method is not None and self.method != method:
            return False
        return self._pattern.search(path) is not None

    def as_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "body": copy.deepcopy(self.body),
            "times": self.times,
            "headers": dict(self.headers),
        }


def parse_rule(raw: object, index: int) -> Rule:
    """A rule from its JSON form (ValueError naming the rule and the field when it is wrong)."""
    where = f"rules[{index}]"
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object")
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown fields: {', '.join(sorted(unknown))}")
    method = raw.get("method")
    if method is not None and (not isinstance(method, str) or not method.isalpha()):
        raise ValueError(f"{where}.method must be an HTTP method such as POST")
    path = raw.get("path")
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where}.path must be a regular expression")
    try:
        re.compile(path)
    except re.error as exc:
        raise ValueError(f"{where}.path is not a valid regular expression: {exc}") from None
    status = raw.get("status")
    if isinstance(status, bool) or not isinstance(status, int) or status not in _RULE_STATUSES:
        raise ValueError(f"{where}.status must be an HTTP status from 200 to 599")
    times = raw.get("times")
    if times is not None:
        times = integer(times, f"{where}.times", minimum=1)
    # Without a body, an error status gets the google-style body the simulator uses itself.
    body = (
        raw["body"]
        if "body" in raw
        else (error_body(status, f"scripted answer: HTTP {status}") if status >= 400 else {})
    )
    headers = raw.get("headers") or {}
    if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k.replace("-", "").isalnum()
            and "\n" not in v and "\r" not in v for k, v in headers.items()):
        raise ValueError(f"{where}.headers must be an object of header names to strings")
    return Rule(
        headers=dict(headers),
        path=path,
        status=status,
        body=copy.deepcopy(body),
        method=method.upper() if isinstance(method, str) else None,
        times=times,
    )


def parse_rules(raw: object) -> tuple[Rule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("rules must be a list")
    if len(raw) > MAX_RULES:
        raise ValueError(f"at most {MAX_RULES} rules")
    return tuple(parse_rule(item, i) for i, item in enumerate(raw))


@dataclass(frozen=True)
class Faults:
    error_rate: float = 0.0
    statuses: tuple[int, ...] = DEFAULT_FAULT_STATUSES
    timeout_rate: float = 0.0
    latency_ms: int = 0
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    rules: tuple[Rule, ...] = ()

    @classmethod
    def build(
        cls,
        *,
        error_rate: float = 0.0,
        statuses: Sequence[int] | None = None,
        timeout_rate: float = 0.0,
        latency_ms: int = 0,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        rules: object = None,
    ) -> Faults:
        chosen = tuple(DEFAULT_FAULT_STATUSES if statuses is None else statuses)
        if not chosen or any(
            isinstance(s, bool) or not isinstance(s, int) or not 400 <= s <= 599 for s in chosen
        ):
            raise ValueError("statuses must be a non-empty list of HTTP error statuses (4xx/5xx)")
        return cls(
            error_rate=rate(error_rate, "error_rate"),
            statuses=chosen,
            timeout_rate=rate(timeout_rate, "timeout_rate"),
            latency_ms=integer(latency_ms, "latency_ms"),
            timeout_seconds=number(timeout_seconds, "timeout_seconds"),
            rules=parse_rules(rules),
        )

    def scripted(self, method: str, path: str) -> Rule | None:
        """The first rule that answers this request, its `times` already spent (the caller
        holds the simulator's lock, so two requests never spend the same answer)."""
        for rule in self.rules:
            if rule.matches(method, path):
                if rule.times is not None:
                    rule.times -= 1
                return rule
        return None

    def as_json(self) -> dict[str, Any]:
        return {
            "error_rate": self.error_rate,
            "statuses": list(self.statuses),
            "timeout_rate": self.timeout_rate,
            "latency_ms": self.latency_ms,
            "timeout_seconds": self.timeout_seconds,
            "rules": [rule.as_json() for rule in self.rules],
        }
