"""Webhook endpoints as a resource (``client.webhooks``): create, list, get, delete, test and
read deliveries, sync and async side by side over the shared transport.

    with Client() as sftq:
        endpoint = sftq.webhooks.create("https://hooks.example.com/finetune")
        print(endpoint.secret)  # shown this once: store it
        sftq.webhooks.test(endpoint.id)
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Final, Protocol, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from .._transport import Call, model_parser
from ..models import WebhookDelivery, WebhookEndpoint, WebhookEndpointCreated

__all__ = ["AsyncWebhooks", "Webhooks"]

T = TypeVar("T")

# Aliases: inside the classes below, `list` is a method's name.
EndpointList = list[WebhookEndpoint]
DeliveryList = list[WebhookDelivery]
_ENDPOINTS: Final = TypeAdapter(EndpointList)
_DELIVERIES: Final = TypeAdapter(DeliveryList)


class Sender(Protocol):
    """What the resource needs of a Client: a way to send one call."""

    def _send(self, call: Call[T]) -> T: ...


class AsyncSender(Protocol):
    def _send(self, call: Call[T]) -> Awaitable[T]: ...


# ---- the API calls ------------------------------------------------------------------------------


def _endpoint_path(endpoint_id: str, suffix: str = "") -> str:
    if not isinstance(endpoint_id, str) or not endpoint_id.strip():
        raise ValueError("endpoint_id must be a non-empty string")

    return f"/webhooks/{quote(endpoint_id.strip(), safe='')}{suffix}"


def _list_parser(adapter: TypeAdapter[Any]) -> Any:
    def parse(response: httpx.Response) -> Any:
        return adapter.validate_python(response.json())

    return parse


class Calls:
    @staticmethod
    def create(url: str, events: Sequence[str] | None, description: str | None
               ) -> Call[WebhookEndpointCreated]:
        body: dict[str, Any] = {"url": url}
        if events is not None:
            if isinstance(events, str):
                raise TypeError("events must be a list of event names, e.g. ['job.succeeded']")
            body["events"] = list(events)
        if description is not None:
            body["description"] = description
        # Not retried: without an idempotency key a lost answer and a retry would make a second
        # endpoint with a second secret. A failed create is for the caller to look at.
        return Call("POST", "/webhooks", model_parser(WebhookEndpointCreated), json=body,
                     retry=False)

    @staticmethod
    def list() -> Call[EndpointList]:
        return Call("GET", "/webhooks", _list_parser(_ENDPOINTS))

    @staticmethod
    def get(endpoint_id: str) -> Call[WebhookEndpoint]:
        return Call("GET", _endpoint_path(endpoint_id), model_parser(WebhookEndpoint))

    @staticmethod
    def delete(endpoint_id: str) -> Call[None]:
        return Call("DELETE", _endpoint_path(endpoint_id), lambda response: None)

    @staticmethod
    def test(endpoint_id: str) -> Call[WebhookDelivery]:
        return Call("POST", _endpoint_path(endpoint_id, "/test"), model_parser(WebhookDelivery))

    @staticmethod
    def deliveries(endpoint_id: str, limit: int | None) -> Call[DeliveryList]:
        params = {} if limit is None else {"limit": str(limit)}
        return Call("GET", _endpoint_path(endpoint_id, "/deliveries"),
                     _list_parser(_DELIVERIES), params=params)


class Webhooks:
    """``client.webhooks``: your webhook endpoints."""

    def __init__(self, client: Sender) -> None:
        self._client = client

    def create(self, url: str, *, events: Sequence[str] | None = None,
               description: str | None = None) -> WebhookEndpointCreated:
        """Add an endpoint. ``events`` defaults to job.succeeded, job.failed, job.cancelled;
        ``["job.*"]`` is everything. The answer's ``secret`` is shown this once."""
        return self._client._send(Calls.create(url, events, description))

    def list(self) -> EndpointList:
        """Your endpoints, newest first."""
        return self._client._send(Calls.list())

    def get(self, endpoint_id: str) -> WebhookEndpoint:
        return self._client._send(Calls.get(endpoint_id))

    def delete(self, endpoint_id: str) -> None:
        self._client._send(Calls.delete(endpoint_id))

    def test(self, endpoint_id: str) -> WebhookDelivery:
        """Queue a ``webhook.test`` delivery; follow it with :meth:`deliveries`."""
        return self._client._send(Calls.test(endpoint_id))

    def deliveries(self, endpoint_id: str, *, limit: int | None = None) -> DeliveryList:
        """Recent attempts, newest first (and deliveries not tried yet)."""
        return self._client._send(Calls.deliveries(endpoint_id, limit))


class AsyncWebhooks:
    """``async_client.webhooks``: as :class:`Webhooks`, awaited."""

    def __init__(self, client: AsyncSender) -> None:
        self._client = client

    async def create(self, url: str, *, events: Sequence[str] | None = None,
                     description: str | None = None) -> WebhookEndpointCreated:
        return await self._client._send(Calls.create(url, events, description))

    async def list(self) -> EndpointList:
        return await self._client._send(Calls.list())

    async def get(self, endpoint_id: str) -> WebhookEndpoint:
        return await self._client._send(Calls.get(endpoint_id))

    async def delete(self, endpoint_id: str) -> None:
        await self._client._send(Calls.delete(endpoint_id))

    async def test(self, endpoint_id: str) -> WebhookDelivery:
        return await self._client._send(Calls.test(endpoint_id))

    async def deliveries(self, endpoint_id: str, *,
                         limit: int | None = None) -> DeliveryList:
        return await self._client._send(Calls.deliveries(endpoint_id, limit))
