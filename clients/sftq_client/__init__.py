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
    AmbiguousJobId,
    APIConnectionError,
    BadRequest,
    ConfigurationError,
    Conflict,
    MissingSetting,
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
    EndEvent,
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
    RetryResult,
    State,
    StatusEvent,
    StreamEvent,
    SubmitResult,
    Summary,
    Timeline,
    WaitingReason,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEndpointCreated,
)
from .webhooks import WebhookVerificationError, verify_webhook

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT",
    "KINDS",
    "STATES",
    "TERMINAL_STATES",
    "APIConnectionError",
    "AmbiguousJobId",
    "AsyncClient",
    "BadRequest",
    "CancelResult",
    "Client",
    "ConfigurationError",
    "Conflict",
    "EndEvent",
    "Job",
    "JobAnalytics",
    "JobPage",
    "Kind",
    "MissingSetting",
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
    "RetryResult",
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
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookEndpointCreated",
    "WebhookVerificationError",
    "__version__",
    "verify_webhook",
]
