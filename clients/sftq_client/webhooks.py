"""Webhooks: manage your endpoints (``client.webhooks``) and verify what they receive.

    with Client() as sftq:
        endpoint = sftq.webhooks.create("https://hooks.example.com/finetune")
        print(endpoint.secret)  # shown this once: store it
        sftq.webhooks.test(endpoint.id)

    # in your receiver
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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import httpx
from pydantic import TypeAdapter

from ._client import _Call, _model_parser
from .errors import SftqError
from .models import WebhookDelivery, WebhookEndpoint, WebhookEndpointCreated

if TYPE_CHECKING:
    from ._client import AsyncClient, Client

__all__ = [
    "DEFAULT_TOLERANCE",
    "AsyncWebhooks",
    "WebhookVerificationError",
    "Webhooks",
    "sign_webhook",
    "verify_webhook",
]

# How far a delivery's webhook-timestamp may be from the receiver's clock (the specification's).
DEFAULT_TOLERANCE: Final = 300.0

# Aliases: inside the classes below, `list` is a method's name.
EndpointList = list[WebhookEndpoint]
DeliveryList = list[WebhookDelivery]
_ENDPOINTS: Final = TypeAdapter(EndpointList)
_DELIVERIES: Final = TypeAdapter(DeliveryList)


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


# ---- the API calls ------------------------------------------------------------------------------


def _endpoint_path(endpoint_id: str, suffix: str = "") -> str:
    if not isinstance(endpoint_id, str) or not endpoint_id.strip():
        raise ValueError("endpoint_id must be a non-empty string")
    from urllib.parse import quote

    return f"/webhooks/{quote(endpoint_id.strip(), safe='')}{suffix}"


def _list_parser(adapter: TypeAdapter[Any]) -> Any:
    def parse(response: httpx.Response) -> Any:
        return adapter.validate_python(response.json())

    return parse


class _Calls:
    @staticmethod
    def create(url: str, events: Sequence[str] | None, description: str | None
               ) -> _Call[WebhookEndpointCreated]:
        body: dict[str, Any] = {"url": url}
        if events is not None:
            if isinstance(events, str):
                raise TypeError("events must be a list of event names, e.g. ['job.succeeded']")
            body["events"] = list(events)
        if description is not None:
            body["description"] = description
        # Not retried: without an idempotency key a lost answer and a retry would make a second
        # endpoint with a second secret. A failed create is for the caller to look at.
        return _Call("POST", "/webhooks", _model_parser(WebhookEndpointCreated), json=body,
                     retry=False)

    @staticmethod
    def list() -> _Call[EndpointList]:
        return _Call("GET", "/webhooks", _list_parser(_ENDPOINTS))

    @staticmethod
    def get(endpoint_id: str) -> _Call[WebhookEndpoint]:
        return _Call("GET", _endpoint_path(endpoint_id), _model_parser(WebhookEndpoint))

    @staticmethod
    def delete(endpoint_id: str) -> _Call[None]:
        return _Call("DELETE", _endpoint_path(endpoint_id), lambda response: None)

    @staticmethod
    def test(endpoint_id: str) -> _Call[WebhookDelivery]:
        return _Call("POST", _endpoint_path(endpoint_id, "/test"), _model_parser(WebhookDelivery))

    @staticmethod
    def deliveries(endpoint_id: str, limit: int | None) -> _Call[DeliveryList]:
        params = {} if limit is None else {"limit": str(limit)}
        return _Call("GET", _endpoint_path(endpoint_id, "/deliveries"),
                     _list_parser(_DELIVERIES), params=params)


class Webhooks:
    """``client.webhooks``: your webhook endpoints."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, url: str, *, events: Sequence[str] | None = None,
               description: str | None = None) -> WebhookEndpointCreated:
        """Add an endpoint. ``events`` defaults to job.succeeded, job.failed, job.cancelled;
        ``["job.*"]`` is everything. The answer's ``secret`` is shown this once."""
        return self._client._send(_Calls.create(url, events, description))

    def list(self) -> EndpointList:
        """Your endpoints, newest first."""
        return self._client._send(_Calls.list())

    def get(self, endpoint_id: str) -> WebhookEndpoint:
        return self._client._send(_Calls.get(endpoint_id))

    def delete(self, endpoint_id: str) -> None:
        self._client._send(_Calls.delete(endpoint_id))

    def test(self, endpoint_id: str) -> WebhookDelivery:
        """Queue a ``webhook.test`` delivery; follow it with :meth:`deliveries`."""
        return self._client._send(_Calls.test(endpoint_id))

    def deliveries(self, endpoint_id: str, *, limit: int | None = None) -> DeliveryList:
        """Recent attempts, newest first (and deliveries not tried yet)."""
        return self._client._send(_Calls.deliveries(endpoint_id, limit))


class AsyncWebhooks:
    """``async_client.webhooks``: as :class:`Webhooks`, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(self, url: str, *, events: Sequence[str] | None = None,
                     description: str | None = None) -> WebhookEndpointCreated:
        return await self._client._send(_Calls.create(url, events, description))

    async def list(self) -> EndpointList:
        return await self._client._send(_Calls.list())

    async def get(self, endpoint_id: str) -> WebhookEndpoint:
        return await self._client._send(_Calls.get(endpoint_id))

    async def delete(self, endpoint_id: str) -> None:
        await self._client._send(_Calls.delete(endpoint_id))

    async def test(self, endpoint_id: str) -> WebhookDelivery:
        return await self._client._send(_Calls.test(endpoint_id))

    async def deliveries(self, endpoint_id: str, *,
                         limit: int | None = None) -> DeliveryList:
        return await self._client._send(_Calls.deliveries(endpoint_id, limit))
