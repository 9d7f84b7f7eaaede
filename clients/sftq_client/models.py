"""Response models for the jobs-api.

Shapes follow the contract field for field. Unknown fields are ignored so that an older client
keeps working against a newer server that adds fields. Timestamps are parsed into timezone-aware
datetimes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "KINDS",
    "STATES",
    "TERMINAL_STATES",
    "CancelResult",
    "Capacity",
    "CapacityUser",
    "EndEvent",
    "Estimate",
    "Event",
    "EventPage",
    "Job",
    "JobAnalytics",
    "JobPage",
    "Kind",
    "Progress",
    "ProgressEvent",
    "ProgressJob",
    "QueueContext",
    "QueueEvent",
    "QueuedJob",
    "RecentFailure",
    "RetryResult",
    "State",
    "StatusEvent",
    "StreamEvent",
    "SubmitResult",
    "Summary",
    "Timeline",
    "WaitingReason",
    "WEBHOOK_EVENTS",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookEndpointCreated",
]

Kind = Literal["SFT", "DPO", "RFT"]
State = Literal["QUEUED", "PROGRESS", "SUCCESS", "FAIL", "CANCELLED"]

KINDS: Final[tuple[Kind, ...]] = ("SFT", "DPO", "RFT")
STATES: Final[tuple[State, ...]] = ("QUEUED", "PROGRESS", "SUCCESS", "FAIL", "CANCELLED")
TERMINAL_STATES: Final[frozenset[State]] = frozenset({"SUCCESS", "FAIL", "CANCELLED"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class PreflightFinding(_Model):
    """One finding of the queue's pre-flight check: where in the request, and what to do."""

    path: str
    message: str


class Job(_Model):
    """One job as ``GET /jobs`` and ``GET /jobs/{id}`` return it."""

    id: str
    kind: Kind
    state: State
    display_name: str | None = None
    gpu_count: int
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    error: str | None = None
    fireworks_job_name: str | None = None
    # Added after the contract's fields; absent from older servers, hence the defaults.
    # For a FAIL job: "permanent", "retryable" or "unknown" (is a retry worth it?).
    failure_class: str | None = None
    # The job this one retries (made by :meth:`Client.retry`).
    retry_of: str | None = None
    # What the pre-flight found doubtful, and Fireworks' cost estimate (a google.type.Money:
    # {"currencyCode", "units", "nanos"}), when there are some.
    warnings: list[PreflightFinding] | None = None
    estimated_cost: dict[str, Any] | None = None
    # The jobs this one runs after (full ids), its own bound on run time, and whether its
    # progress at Fireworks has stopped moving (since ``stalled_since``).
    after: list[str] | None = None
    max_run_seconds: int | None = None
    stalled: bool = False
    stalled_since: datetime | None = None

    @property
    def is_terminal(self) -> bool:
        """True once the job can no longer change (SUCCESS, FAIL or CANCELLED)."""
        return self.state in TERMINAL_STATES


class SubmitResult(_Model):
    """The answer to ``POST /jobs`` (also what an idempotent replay answers). ``warnings``:
    what the pre-flight check found doubtful (the job is enqueued all the same)."""

    id: str
    kind: Kind
    state: State
    created_at: datetime
    warnings: list[PreflightFinding] = Field(default_factory=list)
    # Fireworks' cost estimate of an SFT job, when the pre-flight got one at enqueue.
    estimated_cost: dict[str, Any] | None = None
    # What the request gave (issue 53): the jobs it runs after, its bound on run time.
    after: list[str] | None = None
    max_run_seconds: int | None = None


class ValidateResult(_Model):
    """The answer to ``POST /jobs:validate``: the findings; nothing was enqueued."""

    valid: bool
    kind: Kind
    errors: list[PreflightFinding]
    warnings: list[PreflightFinding]
    schema_version: str
    # Whether Fireworks was asked about the dataset, evaluator and models: "done",
    # "unanswered" (not within the server's budget) or "unavailable" (no credentials there).
    provider_checks: str | None = None
    estimated_cost: dict[str, Any] | None = None


class RetryResult(SubmitResult):
    """The answer to ``POST /jobs/{id}/retry``: the new job, and the job it retries."""

    retry_of: str


class CancelResult(Job):
    """The answer to ``DELETE /jobs/{id}``.

    ``pending`` is True when the server answered 202: the job was PROGRESS, the cancel is recorded
    and the scheduler finishes it at its next tick, so ``state`` is still PROGRESS here.
    ``message`` is the server's explanation in that case.
    """

    message: str | None = None
    pending: bool = False


class JobPage(_Model):
    """One page of ``GET /jobs``: the jobs, newest first, and the next page's cursor, if any."""

    items: list[Job]
    next_cursor: str | None = None

    @property
    def has_more(self) -> bool:
        return self.next_cursor is not None


class ProgressJob(_Model):
    """The caller's running job inside :class:`QueueContext`."""

    id: str
    display_name: str | None = None
    kind: Kind
    gpu_count: int
    started_at: datetime | None = None
    fireworks_job_name: str | None = None


class WaitingReason(_Model):
    """Why a QUEUED job waits: ``code`` for programs (behind_own_running_job,
    behind_own_queued_job, does_not_fit, behind_job_that_does_not_fit, next_tick, user_disabled,
    scheduler_stalled, waiting_for_dependency, or codes a newer server adds) and ``message``
    for people."""

    code: str
    message: str | None = None


class Estimate(_Model):
    """What an estimated time rests on, or why there is none (``basis`` then starts with
    "no estimate:")."""

    basis: str


class QueuedJob(_Model):
    """One of the caller's waiting jobs inside :class:`QueueContext`."""

    id: str
    display_name: str | None = None
    kind: Kind
    gpu_count: int
    created_at: datetime
    # Other users' QUEUED jobs ahead of this one; the caller's own earlier jobs are not counted.
    queue_position: int
    # None from servers older than the waiting reasons.
    waiting_reason: WaitingReason | None = None
    # When it should start (an estimate); None with the reason in estimate.basis.
    estimated_start_at: datetime | None = None
    estimate: Estimate | None = None


class QueueContext(_Model):
    """``GET /jobs/analytics/queue``."""

    your_progress_job: ProgressJob | None = None
    your_queued_jobs: list[QueuedJob] = []
    global_queue_depth: int
    global_progress_count: int
    global_gpu_in_use: int


class RecentFailure(_Model):
    """One entry of :attr:`Summary.recent_failures`."""

    id: str
    display_name: str | None = None
    kind: Kind
    gpu_count: int
    error: str | None = None
    failed_at: datetime | None = None


class Summary(_Model):
    """``GET /jobs/analytics/summary``: lifetime aggregates over the caller's jobs."""

    total: int
    by_state: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    # None until at least one job is terminal.
    success_rate: float | None = None
    # None until at least one job succeeded.
    avg_run_duration_seconds: float | None = None
    total_gpu_hours: float = 0.0
    recent_failures: list[RecentFailure] = []

    @field_validator("total_gpu_hours", mode="before")
    @classmethod
    def _null_sum_is_zero(cls, value: Any) -> Any:
        # A SQL SUM over no rows is NULL; for a total, zero is the honest reading.
        return 0.0 if value is None else value


class Timeline(_Model):
    queued_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None


class Progress(_Model):
    """How far a running job is, as the provider last reported it."""

    percent: float | None = None
    epoch: int | None = None


class JobAnalytics(_Model):
    """``GET /jobs/{id}/analytics``: timing and GPU cost of one job."""

    id: str
    display_name: str | None = None
    kind: Kind
    state: State
    gpu_count: int
    fireworks_job_name: str | None = None
    timeline: Timeline
    # None until the job has started.
    queue_wait_seconds: float | None = None
    # None until the job has finished.
    run_duration_seconds: float | None = None
    gpu_hours: float | None = None
    error: str | None = None
    # QUEUED only: other users' queued jobs ahead, why it waits, when it should start.
    queue_position: int | None = None
    waiting_reason: WaitingReason | None = None
    estimated_start_at: datetime | None = None
    # PROGRESS only: when it should end (an estimate).
    estimated_finish_at: datetime | None = None
    estimate: Estimate | None = None
    # As the provider last reported them.
    provider_state: str | None = None
    progress: Progress | None = None
    estimated_cost: Any = None


class Event(_Model):
    """One entry of a job's history (``GET /jobs/{id}/events``), oldest first."""

    id: str
    job_id: str
    # queued, admitted, submitted, provider_state, cancelled, succeeded, failed, ... (open set)
    type: str
    # The job's state right after the event.
    state: State
    message: str
    created_at: datetime
    # The event's details, secrets redacted.
    data: dict[str, Any] = {}


class EventPage(_Model):
    """One page of a job's events; ``has_more`` says whether more follow the last one."""

    data: list[Event]
    has_more: bool = False


class CapacityQuota(_Model):
    id: str
    limit: int | None = None
    usage: float | None = None
    read_at: datetime | None = None


class JobsAndGpus(_Model):
    jobs: int
    gpus: int


class CapacityUser(_Model):
    """A user with running or queued work; "others" folds everyone else on servers that hide
    names (cap is then None)."""

    name: str
    cap: int | None = None
    running_jobs: int
    running_gpus: int
    queued_jobs: int
    queued_gpus: int


class SchedulerHealth(_Model):
    last_tick_at: datetime | None = None
    interval_seconds: float
    healthy: bool


class Capacity(_Model):
    """``GET /capacity``: the GPU quota as last read, what runs and waits, and per user."""

    quota: CapacityQuota
    # GPUs admission could spend now; None before the scheduler read the quota.
    free_gpus: int | None = None
    running: JobsAndGpus
    queued: JobsAndGpus
    users: list[CapacityUser] = []
    scheduler: SchedulerHealth


# ---- the live stream (GET /jobs/{id}/stream, GET /jobs/stream) ----------------------------------


# Progress and WaitingReason (above) are shared with GET /jobs/{id}/analytics.


class StatusEvent(_Model):
    """``event: status``: the job record right after a change of state (or on connect)."""

    type: Literal["status"] = "status"
    id: str
    job: Job


class ProgressEvent(_Model):
    """``event: progress``: the provider's sub-state or progress of a running job changed."""

    type: Literal["progress"] = "progress"
    id: str
    job_id: str
    provider_state: str | None = None
    progress: Progress | None = None
    estimated_finish_at: datetime | None = None


class QueueEvent(_Model):
    """``event: queue``: a tick changed a queued job's position, waiting reason or estimate."""

    type: Literal["queue"] = "queue"
    id: str
    job_id: str
    queue_position: int | None = None
    waiting_reason: WaitingReason | None = None
    estimated_start_at: datetime | None = None


class EndEvent(_Model):
    """``event: end``: the job reached a terminal state; the stream is over."""

    type: Literal["end"] = "end"
    id: str
    job_id: str | None = None


StreamEvent = StatusEvent | ProgressEvent | QueueEvent | EndEvent
# ---- webhooks (docs/webhooks.md) ----------------------------------------------------------------

WEBHOOK_EVENTS: Final[tuple[str, ...]] = (
    "job.queued",
    "job.admitted",
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.*",
)


class WebhookEndpoint(_Model):
    """One of your webhook endpoints (``GET /webhooks/{id}``); never its secret."""

    id: str
    url: str
    events: list[str]
    description: str | None = None
    enabled: bool
    created_at: datetime
    disabled_at: datetime | None = None
    # Why deliveries stopped: the receiver answered 410 Gone, or retries failed for 3 days.
    disabled_reason: str | None = None


class WebhookEndpointCreated(WebhookEndpoint):
    """The answer to ``POST /webhooks``: the endpoint and its signing secret, shown this once."""

    secret: str


class WebhookDelivery(_Model):
    """One attempt (or a delivery not tried yet: ``attempt`` 0, ``outcome`` pending)."""

    webhook_id: str
    type: str
    job_id: str | None = None
    attempt: int
    outcome: Literal["pending", "succeeded", "retrying", "failed"]
    status_code: int | None = None
    duration_ms: int | None = None
    error: str | None = None
    created_at: datetime
    attempted_at: datetime | None = None
    next_retry_at: datetime | None = None
