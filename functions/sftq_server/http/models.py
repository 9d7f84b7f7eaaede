"""pydantic models of every request and response body of jobs-api and analytics.

Only `SubmitRequest` runs on the hot path (POST /jobs validates the raw body with
`model_validate_json`). Response bodies are built by the procedures as JSON text and passed
through; the response models here document those shapes and the tests hold the procedures and
docs/openapi.json to them (extra="forbid": a field added on one side only fails a test).
"""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

Kind = Literal["SFT", "DPO", "RFT"]
State = Literal["QUEUED", "PROGRESS", "SUCCESS", "FAIL", "CANCELLED"]

KINDS: tuple[str, ...] = ("SFT", "DPO", "RFT")
STATES: tuple[str, ...] = ("QUEUED", "PROGRESS", "SUCCESS", "FAIL", "CANCELLED")
TERMINAL_STATES: tuple[str, ...] = ("SUCCESS", "FAIL", "CANCELLED")


def upper_ascii(value: object) -> object:
    """States and kinds are case-insensitive for callers ("sft" is SFT, "queued" is QUEUED).
    ASCII only: str.upper() maps U+017F (long s) to "S" too, a spelling of SFT that
    docs/openapi.json's pattern does not accept and no caller means."""
    return value.upper() if isinstance(value, str) and value.isascii() else value


DEFAULT_GPU_COUNT = 4
MAX_GPU_COUNT = 64
MAX_DISPLAY_NAME = 256
MAX_IDEMPOTENCY_KEY = 255
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_QUEUE_TIMEOUT = 2_592_000  # 30 days
# Issue 53: a job may run after at most this many of the caller's jobs ("after"), and be
# bounded to run between these (max_run_seconds; sql/procedures/200, 205 check the same).
MAX_AFTER = 20
MIN_RUN_SECONDS = 60
MAX_RUN_SECONDS = 2_592_000  # 30 days


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SubmitRequest(_Strict):
    """POST /jobs. Unknown top-level fields are refused, so a typo (`gpus`) is an error rather
    than a silently ignored setting. Strict types: `true` or `4.0` is not a gpu_count."""

    kind: Kind
    fireworks_payload: dict[str, Any]
    display_name: StrictStr | None = Field(default=None, max_length=MAX_DISPLAY_NAME)
    gpu_count: StrictInt = Field(default=DEFAULT_GPU_COUNT, ge=1, le=MAX_GPU_COUNT)
    # How long the job may stay QUEUED before the scheduler cancels it (issue 10).
    queue_timeout_seconds: StrictInt | None = Field(default=None, ge=1, le=MAX_QUEUE_TIMEOUT)
    # Issue 44: "off" skips the pre-flight shape check for this request.
    validate_: Literal["on", "off"] = Field(default="on", alias="validate")
    # Issue 53: the caller's jobs (full ids or id prefixes) that must all be SUCCESS before
    # this one may start; and how long it may run at Fireworks before the queue stops it.
    after: list[StrictStr] | None = Field(default=None)
    max_run_seconds: StrictInt | None = Field(default=None, ge=MIN_RUN_SECONDS,
                                              le=MAX_RUN_SECONDS)

    @field_validator("kind", mode="before")
    @classmethod
    def _kind_any_case(cls, value: object) -> object:
        # Issue 18.6: "sft" is SFT here as in GET /jobs?kind=, the client and the CLI.
        return upper_ascii(value)


SUBMIT_FIELDS: frozenset[str] = frozenset(f.alias or name
                                          for name, f in SubmitRequest.model_fields.items())


class _Body(BaseModel):
    """Response shapes: strict about which keys exist, lenient about JSON number types.

    Built on first use (defer_build): no server process validates a response, so building
    their validators at import cost every cold start 10-15 ms for nothing (this module's import
    after pydantic's: median 35 ms with them, 26 ms without); the tests, the client and the
    OpenAPI generator build each one the first time they use it."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class PreflightFinding(_Body):
    """One finding of the pre-flight check: where in the request, and what to do."""

    path: str
    message: str


class _Enqueued(_Body):
    id: UUID
    kind: Kind
    state: State
    created_at: str


class SubmitResponse(_Enqueued):
    # Issue 44: what the pre-flight found doubtful, and Fireworks' cost estimate of an SFT job
    # (each present only when there is one).
    warnings: list[PreflightFinding] | None = None
    estimated_cost: dict[str, Any] | None = None
    # Issue 53: present when the request gave after or max_run_seconds.
    after: list[UUID] | None = None
    max_run_seconds: int | None = None


class ValidateResponse(_Body):
    """POST /jobs:validate: every check run, nothing enqueued."""

    valid: bool
    kind: Kind
    errors: list[PreflightFinding]
    warnings: list[PreflightFinding]
    schema_version: str
    provider_checks: Literal["done", "unanswered", "skipped", "unavailable"]
    estimated_cost: dict[str, Any] | None


class Job(_Body):
    id: UUID
    kind: Kind
    state: State
    display_name: str | None
    gpu_count: int
    created_at: str
    started_at: str | None
    completed_at: str | None
    error: str | None
    fireworks_job_name: str | None
    # Added after the contract's fields (issue 10).
    failure_class: Literal["permanent", "retryable", "unknown"] | None
    retry_of: UUID | None
    # Added by issue 44: the pre-flight's doubtful findings and the cost estimate.
    warnings: list[PreflightFinding] | None
    estimated_cost: dict[str, Any] | None
    # Added by issue 53: the jobs it runs after (full ids), its own bound on run time, and
    # whether its provider progress has stopped moving (and since when).
    after: list[UUID] | None
    max_run_seconds: int | None
    stalled: bool
    stalled_since: str | None


class RetryResponse(_Enqueued):
    """POST /jobs/{id}/retry: the new job, in the enqueue shape, and the job it retries."""

    retry_of: UUID


class CancelAccepted(Job):
    """DELETE /jobs/{id} answered 202: the job as it is (still PROGRESS) and what happens next."""

    message: str


class ProgressJob(_Body):
    id: UUID
    display_name: str | None
    kind: Kind
    gpu_count: int
    started_at: str | None
    fireworks_job_name: str | None


WaitingCode = Literal["behind_own_running_job", "behind_own_queued_job", "does_not_fit",
                      "behind_job_that_does_not_fit", "next_tick", "user_disabled",
                      "scheduler_stalled", "waiting_for_dependency"]


class WaitingReason(_Body):
    """Why a QUEUED job waits, from the same walk admission makes."""

    code: WaitingCode
    message: str


class Estimate(_Body):
    """What an estimated_start_at / estimated_finish_at rests on, or why there is none."""

    basis: str


class QueuedJob(_Body):
    id: UUID
    display_name: str | None
    kind: Kind
    gpu_count: int
    created_at: str
    queue_position: int
    waiting_reason: WaitingReason
    estimated_start_at: str | None
    estimate: Estimate


class QueueContext(_Body):
    your_progress_job: ProgressJob | None
    your_queued_jobs: list[QueuedJob]
    global_queue_depth: int
    global_progress_count: int
    global_gpu_in_use: int


class ByState(_Body):
    QUEUED: int
    PROGRESS: int
    SUCCESS: int
    FAIL: int
    CANCELLED: int


class ByKind(_Body):
    SFT: int
    DPO: int
    RFT: int


class RecentFailure(_Body):
    id: UUID
    display_name: str | None
    kind: Kind
    gpu_count: int
    error: str | None
    failed_at: str | None


class Summary(_Body):
    total: int
    by_state: ByState
    by_kind: ByKind
    success_rate: float | None
    avg_run_duration_seconds: int | None
    total_gpu_hours: float
    recent_failures: list[RecentFailure]


class Timeline(_Body):
    queued_at: str
    started_at: str | None
    completed_at: str | None


class Progress(_Body):
    percent: float | None
    epoch: int | None


class JobAnalytics(_Body):
    id: UUID
    display_name: str | None
    kind: Kind
    state: State
    gpu_count: int
    fireworks_job_name: str | None
    timeline: Timeline
    queue_wait_seconds: int | None
    run_duration_seconds: int | None
    gpu_hours: float | None
    error: str | None
    queue_position: int | None
    waiting_reason: WaitingReason | None
    estimated_start_at: str | None
    estimated_finish_at: str | None
    estimate: Estimate | None
    provider_state: str | None
    progress: Progress | None
    estimated_cost: Any


class Event(_Body):
    """One entry of a job's history (GET /jobs/{id}/events)."""

    id: str
    job_id: UUID
    type: str
    state: State
    message: str
    created_at: str
    data: dict[str, Any]


class EventPage(_Body):
    data: list[Event]
    has_more: bool


class Quota(_Body):
    id: str
    limit: int | None
    usage: float | None
    read_at: str | None


class JobsAndGpus(_Body):
    jobs: int
    gpus: int


class CapacityUser(_Body):
    name: str
    cap: int | None
    running_jobs: int
    running_gpus: int
    queued_jobs: int
    queued_gpus: int


class SchedulerHealth(_Body):
    last_tick_at: str | None
    interval_seconds: float
    healthy: bool


class Capacity(_Body):
    quota: Quota
    free_gpus: int | None
    running: JobsAndGpus
    queued: JobsAndGpus
    users: list[CapacityUser]
    scheduler: SchedulerHealth


class Health(_Body):
    status: Literal["ok"]
    database: Literal["ok"]
    last_tick: str | None
    # Whether the provider accepts our credentials, as the newest tick that asked found.
    provider: Literal["ok", "provider_auth_failed"] | None


class Error(_Body):
    error: str
    code: str
    details: Any = None
