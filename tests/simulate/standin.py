"""A stand-in for sftq_server.simulate.trace's dataclasses (the same fields), so that the
engine's tests do not wait for the trace reader."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TraceJob:
    id: str
    submit_at: float
    user: str
    kind: str
    gpu_count: int
    run_seconds: float
    outcome: str = "SUCCESS"
    outcome_at: float | None = None
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExternalUsage:
    at: float
    gpus: int


@dataclass(frozen=True)
class Trace:
    jobs: tuple[TraceJob, ...]
    external: tuple[ExternalUsage, ...] = ()


def job(jid: str, at: float, user: str, gpus: int, run: float, **kw: object) -> TraceJob:
    return TraceJob(jid, at, user, str(kw.pop("kind", "SFT")), gpus, run, **kw)  # type: ignore[arg-type]
