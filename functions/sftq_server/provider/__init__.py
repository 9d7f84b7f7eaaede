"""Fireworks control-plane client: fine-tuning jobs and the training GPU quota.

Knows HTTP and Fireworks, nothing of the database. The scheduler is the only caller that
decides what an error means for a job; this module only sorts failures into the few classes
the scheduler acts on (see `ProviderError` and its subclasses). There are no retries here on
purpose: a failed call is retried by the next scheduler tick, which re-reads state first.

The same client talks to Fireworks and to the simulator (`sftq_server.simulator`); only the
base URL differs.

The package is split by concept: `names` (collections, ids, resource names), `states` (job
states and their mapping), `errors` (the failure classes and error-body parsing), `models`
(ProviderJob, Quota), `budget` (the hook through which every call asks the deployment's one
request budget for a slot) and `client` (FireworksClient). Everything is re-exported here, so
`from sftq_server.provider import X` is the one import callers use.
"""

from __future__ import annotations

from sftq_server.provider.budget import SOURCES, CallBudget, Grant
from sftq_server.provider.client import (
    DEFAULT_BASE_URL,
    DEFAULT_QUOTA_ID,
    DEFAULT_RATE_LIMIT_SECONDS,
    DEFAULT_RPM,
    DEFAULT_TIMEOUT,
    MAX_RETRY_AFTER_SECONDS,
    FireworksClient,
)
from sftq_server.provider.errors import (
    AlreadyExists,
    AuthError,
    BudgetSpent,
    NotFound,
    ProviderError,
    RateLimited,
    Rejected,
    Transient,
    parse_error_code,
    parse_error_message,
    parse_retry_after,
)
from sftq_server.provider.models import ProviderJob, Quota
from sftq_server.provider.names import (
    ID_PARAM,
    KIND_COLLECTION,
    PUBLIC_ACCOUNT,
    RESOURCE_RE,
    full_resource_name,
    provider_job_id,
    resource_account,
    resource_name_problem,
    segment,
)
from sftq_server.provider.states import (
    ProviderOutcome,
    is_known_state,
    map_provider_state,
    normalize_state,
)

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_QUOTA_ID",
    "DEFAULT_RATE_LIMIT_SECONDS",
    "DEFAULT_RPM",
    "DEFAULT_TIMEOUT",
    "ID_PARAM",
    "KIND_COLLECTION",
    "MAX_RETRY_AFTER_SECONDS",
    "PUBLIC_ACCOUNT",
    "RESOURCE_RE",
    "SOURCES",
    "AlreadyExists",
    "AuthError",
    "BudgetSpent",
    "CallBudget",
    "FireworksClient",
    "Grant",
    "NotFound",
    "ProviderError",
    "ProviderJob",
    "ProviderOutcome",
    "Quota",
    "RateLimited",
    "Rejected",
    "Transient",
    "full_resource_name",
    "is_known_state",
    "map_provider_state",
    "normalize_state",
    "parse_error_code",
    "parse_error_message",
    "parse_retry_after",
    "provider_job_id",
    "resource_account",
    "resource_name_problem",
    "segment",
]
