"""Webhook delivery: sealed secrets (secrets.py), destination checks (destinations.py),
Standard Webhooks signatures (secrets.py), the pinned HTTP sender (sender.py), the deliverer
that drains the outbox (deliverer.py, over sql/procedures/120_webhooks.sql) and the
webhook-deliver function (http.py).

What happens to a delivery is decided in SQL (sftq.webhook_record_attempt); this module only
finds out what the receiver answered, safely:

- Destinations are checked after DNS resolution at every attempt, and the connection goes to
  the address that was checked (never resolved a second time), so a name that resolves to a
  public address when checked and to 127.0.0.1 a moment later cannot reach loopback.
- https only, no private, loopback, link-local, metadata or otherwise non-public address,
  unless allow_private (SFTQ_WEBHOOKS_ALLOW_PRIVATE=true, set by `sftq dev`; then http:// too).
- 10 s for the whole exchange, redirects never followed, at most 64 KiB of the answer read.
- Signing secrets are sealed at rest (AES-256-GCM under SFTQ_WEBHOOKS_KEY) and never logged;
  log lines name the destination host only (a URL's path or query may itself be a secret).

Heavy imports (ssl, cryptography, the thread pool) happen where they are used: jobs-api imports
this module for its URL checks and should not pay for them at cold start.
"""

from __future__ import annotations

# The room's public face; each part lives in a module of its own.
from sftq_server.webhooks.deliverer import Claimed, Deliverer, Outcome
from sftq_server.webhooks.destinations import (
    BadUrl,
    DestinationRefused,
    Resolver,
    Target,
    address_refusal,
    check_destination,
    parse_url,
    resolve_checked,
    system_resolver,
)
from sftq_server.webhooks.http import DeliverApp, make_deliver_app
from sftq_server.webhooks.secrets import NotConfigured, SecretBox, new_secret, sign
from sftq_server.webhooks.sender import (
    MAX_RESPONSE_BYTES,
    TIMEOUT_SECONDS,
    Answer,
    connect_tcp,
    send,
)

EVENT_TYPES: tuple[str, ...] = (
    "job.queued", "job.admitted", "job.succeeded", "job.failed", "job.cancelled")
ALL_EVENTS = "job.*"
DEFAULT_EVENTS: tuple[str, ...] = ("job.succeeded", "job.failed", "job.cancelled")
TEST_EVENT = "webhook.test"
MAX_ENDPOINTS = 10
MAX_DESCRIPTION = 500

__all__ = [
    "ALL_EVENTS", "DEFAULT_EVENTS", "EVENT_TYPES", "MAX_DESCRIPTION", "MAX_ENDPOINTS",
    "MAX_RESPONSE_BYTES", "TEST_EVENT", "TIMEOUT_SECONDS", "address_refusal", "Answer",
    "BadUrl", "check_destination", "Claimed", "connect_tcp", "DeliverApp", "Deliverer",
    "DestinationRefused", "make_deliver_app", "new_secret", "NotConfigured", "Outcome",
    "parse_url", "resolve_checked", "Resolver", "SecretBox", "send", "sign", "system_resolver",
    "Target",
]
