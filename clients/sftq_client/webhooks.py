"""Webhooks: manage your endpoints (``client.webhooks``, in ``resources/webhooks.py``) and verify
what they receive (``webhook_signatures.py``). This module keeps both under one public name."""

from __future__ import annotations

from .resources.webhooks import AsyncWebhooks, Webhooks
from .webhook_signatures import (
    DEFAULT_TOLERANCE,
    WebhookVerificationError,
    sign_webhook,
    verify_webhook,
)

__all__ = [
    "DEFAULT_TOLERANCE",
    "AsyncWebhooks",
    "WebhookVerificationError",
    "Webhooks",
    "sign_webhook",
    "verify_webhook",
]
