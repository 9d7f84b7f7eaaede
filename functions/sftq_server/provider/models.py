"""The provider's resources as we read them: a fine-tuning job and a quota."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sftq_server.provider.errors import ProviderError, rpc_name
from sftq_server.provider.states import ProviderOutcome, map_provider_state


@dataclass(frozen=True)
class ProviderJob:
    """One Fireworks fine-tuning job as the API returned it.

    `status_code` is `status.code` (a google.rpc code name such as INTERNAL), `progress_*`
    come from `jobProgress`, `estimated_cost` is `estimatedCost` as sent (its shape is not
    documented; it is stored verbatim). Each is None when the provider did not report it.
    """

    name: str
    job_id: str
    kind: str
    state: str | None
    message: str | None
    raw: dict[str, Any]
    status_code: str | None = None
    progress_percent: float | None = None
    progress_epoch: int | None = None
    estimated_cost: Any = None

    @property
    def outcome(self) -> ProviderOutcome | None:
        return map_provider_state(self.state)

    @classmethod
    def from_resource(cls, kind: str, resource: dict[str, Any], job_id: str = "") -> ProviderJob:
        raw_name = resource.get("name")
        name = raw_name if isinstance(raw_name, str) else ""
        state = resource.get("state")
        status = resource.get("status")
        message = status.get("message") if isinstance(status, dict) else None
        code = status.get("code") if isinstance(status, dict) else None
        progress = resource.get("jobProgress")
        progress = progress if isinstance(progress, dict) else {}
        return cls(
            name=name,
            job_id=name.rsplit("/", 1)[-1] if name else job_id,
            kind=kind,
            state=state if isinstance(state, str) else None,
            message=message if isinstance(message, str) and message else None,
            raw=resource,
            status_code=rpc_name(code),
            progress_percent=_finite(progress.get("percent")),
            progress_epoch=_whole(progress.get("epoch")),
            estimated_cost=resource.get("estimatedCost"),
        )



def _finite(raw: object) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _whole(raw: object) -> int | None:
    value = _finite(raw)
    return int(value) if value is not None and value.is_integer() else None


@dataclass(frozen=True)
class Quota:
    """A Fireworks quota; for training GPUs, `usage` counts GPUs held by running jobs."""

    name: str
    value: int
    max_value: int
    usage: float

    @property
    def limit(self) -> int:
        # `value` is the limit Fireworks enforces and may sit below `maxValue`; budgeting
        # against the smaller of the two never admits a job that Fireworks would refuse.
        return min(self.value, self.max_value)

    @property
    def available(self) -> float:
        return self.limit - self.usage

    @classmethod
    def from_resource(cls, resource: dict[str, Any]) -> Quota:
        # proto3 JSON omits zero values, so a missing field means 0. The exception is a
        # missing `value` altogether: then fall back to `maxValue`, which is the contract's
        # own formula (maxValue - usage), rather than halting admission for good.
        max_value = _as_int(resource.get("maxValue"), "maxValue")
        raw_value = resource.get("value")
        value = max_value if raw_value is None else _as_int(raw_value, "value")
        name = resource.get("name")
        return cls(
            name=name if isinstance(name, str) else "",
            value=value,
            max_value=max_value,
            usage=_as_float(resource.get("usage"), "usage"),
        )


def _as_int(raw: object, field: str) -> int:
    # int64 fields arrive as JSON strings; accept plain numbers as well.
    if raw is None:
        return 0
    if isinstance(raw, bool):
        raise ProviderError(f"quota field {field} is not a number: {raw!r}")
    try:
        if isinstance(raw, str):
            return int(raw.strip())
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
    except ValueError:
        pass
    raise ProviderError(f"quota field {field} is not an integer: {raw!r}")


def _as_float(raw: object, field: str) -> float:
    if raw is None:
        return 0.0
    if isinstance(raw, bool):
        raise ProviderError(f"quota field {field} is not a number: {raw!r}")
    try:
        if isinstance(raw, int | float | str):
            result = float(raw)
            if math.isfinite(result):
                return result
    except ValueError:
        pass
    raise ProviderError(f"quota field {field} is not a number: {raw!r}")

