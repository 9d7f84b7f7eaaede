"""Verify what your webhook endpoint receives (and sign test deliveries of your own).

    event = verify_webhook(secret, request_body, request_headers)

Deliveries follow the Standard Webhooks specification (https://www.standardwebhooks.com):
headers ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature``, the signature an
HMAC-SHA256 of ``"{id}.{timestamp}.{body}"``. ``verify_webhook`` does what the specification's
own library does, with the standard library only, so the client keeps its two dependencies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any, Final

from .errors import SftqError

__all__ = ["DEFAULT_TOLERANCE", "WebhookVerificationError", "sign_webhook", "verify_webhook"]

# How far a delivery's webhook-timestamp may be from the receiver's clock (the specification's).
DEFAULT_TOLERANCE: Final = 300.0


class WebhookVerificationError(SftqError):
    """A delivery that does not verify: missing headers, a stale timestamp, a bad signature."""


def _secret_key(secret: str) -> bytes:
    raw = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret is whsec_ followed by base64") from None
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def sign_webhook(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for a body (``v1,<base64 HMAC-SHA256>``)."""
    mac = hmac.new(_secret_key(secret), f"{webhook_id}.{timestamp}.".encode() + body,
                   hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify_webhook(secret: str, body: bytes | str, headers: Mapping[str, str], *,
                   tolerance: float = DEFAULT_TOLERANCE, now: float | None = None) -> Any:
    """Verify one delivery and return its parsed JSON body.

    ``body`` must be the raw bytes received (re-serialized JSON will not verify). Raises
    :class:`WebhookVerificationError` when a header is missing, the timestamp is more than
    ``tolerance`` seconds away from now (a replay), or no ``v1`` signature matches.
    """
    data = body.encode() if isinstance(body, str) else bytes(body)
    lower = {k.lower(): v for k, v in headers.items()}
    webhook_id = lower.get("webhook-id")
    timestamp = lower.get("webhook-timestamp")
    signatures = lower.get("webhook-signature")
    if not (webhook_id and timestamp and signatures):
        raise WebhookVerificationError(
            "missing webhook-id, webhook-timestamp or webhook-signature header")
    try:
        sent = int(timestamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not a number") from None
    clock = time.time() if now is None else now
    if abs(clock - sent) > tolerance:
        raise WebhookVerificationError(
            f"webhook-timestamp is {int(clock - sent)}s away from this clock (more than "
            f"{tolerance:g}s): a replay, or a clock that is off")
    expected = base64.b64decode(sign_webhook(secret, webhook_id, sent, data).split(",", 1)[1])
    for candidate in signatures.split(" "):
        version, _, value = candidate.partition(",")
        if version != "v1":
            continue
        try:
            given = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        if hmac.compare_digest(expected, given):
            try:
                return json.loads(data)
            except ValueError:
                raise WebhookVerificationError("the body is not JSON") from None
    raise WebhookVerificationError("no signature matches: wrong secret, or the body was changed")
