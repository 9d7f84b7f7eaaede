"""Python client for finetune-queue, the fair FIFO queue in front of Fireworks fine-tuning.

from sftq_client import Client

with Client() as sftq:  # SFTQ_API_KEY and SFTQ_API_URL / SUPABASE_URL from the environment
    job = sftq.submit("SFT", payload, display_name="baseline")
    final = sftq.wait(job.id)
"""

from __future__ import annotations

from ._client import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, AsyncClient, Client
from ._stream import StreamUnavailable
from ._version import __version__
from .errors import (
    APIConnectionError,
    BadRequest,
    ConfigurationError,
    Conflict,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    SftqError,
    Timeout,
    Unauthorized,
    WaitTimeout,
)
from .models import (
    KINDS,
    STATES,
    TERMINAL_STATES,
    CancelResult,
    Capacity,
    CapacityUser,
    EndEvent,
    Estimate,
    Event,
    EventPage,
    Job,
    JobAnalytics,
    JobPage,
    Kind,
    Progress,
    ProgressEvent,
    ProgressJob,
    QueueContext,
    QueuedJob,
    QueueEvent,
    RecentFailure,
    State,
    StatusEvent,
    StreamEvent,
    SubmitResult,
    Summary,
    Timeline,
    WaitingReason,
)

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT",
    "KINDS",
    "STATES",
    "TERMINAL_STATES",
    "APIConnectionError",
    "AsyncClient",
    "BadRequest",
    "CancelResult",
    "Capacity",
    "CapacityUser",
    "Client",
    "ConfigurationError",
    "Conflict",
    "EndEvent",
    "Estimate",
    "Event",
    "EventPage",
    "Job",
    "JobAnalytics",
    "JobPage",
    "Kind",
    "NotFound",
    "PayloadTooLarge",
    "Progress",
    "ProgressEvent",
    "ProgressJob",
    "QueueContext",
    "QueueEvent",
    "QueuedJob",
    "RateLimited",
    "RecentFailure",
    "ServerError",
    "ServiceUnavailable",
    "SftqError",
    "State",
    "StatusEvent",
    "StreamEvent",
    "StreamUnavailable",
    "SubmitResult",
    "Summary",
    "Timeline",
    "Timeout",
    "Unauthorized",
    "WaitTimeout",
    "WaitingReason",
    "__version__",
]
