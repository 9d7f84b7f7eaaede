"""jobs-api's webhook routes: the caller's own endpoints, a test delivery, recent attempts.

    POST   /webhooks                     add an endpoint (201, its secret shown this once)
    GET    /webhooks                     the caller's endpoints, newest first
    GET    /webhooks/{id}                one of them (404 when not the caller's)
    DELETE /webhooks/{id}                remove it (204)
    POST   /webhooks/{id}/test           queue a webhook.test delivery (202)
    GET    /webhooks/{id}/deliveries     recent attempts, newest first

Same shape as api.py: authenticate, validate, call ONE procedure (sql/procedures/
120_webhooks.sql), pass its JSON through. POST /webhooks also checks the destination (in
production: https, and every address the name resolves to is public) and seals the new secret
before the database sees it. Delivery itself is sftq_server.webhooks.
"""

from __future__ import annotations

import json
import logging
import uuid

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from sftq_server import db as dbmod
from sftq_server import webhooks
from sftq_server.core.errors import BadRequest, NotFound
from sftq_server.core.settings import Settings
from sftq_server.http.checks import (
    UUID_RE,
    authenticate,
    check_json_content_type,
    check_query,
    limit_param,
    one_row,
)
from sftq_server.http.web import JSON_HEADERS, Request, Response

logger = logging.getLogger("sftq.api")

DEFAULT_DELIVERIES = 50
MAX_DELIVERIES = 200
_EVENT_CHOICES = ", ".join((*webhooks.EVENT_TYPES, webhooks.ALL_EVENTS))


# --- request and response bodies ------------------------------------------------------------

class CreateWebhookRequest(BaseModel):
    """POST /webhooks. Unknown fields are refused, as on POST /jobs."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    url: StrictStr
    events: list[StrictStr] | None = None
    description: StrictStr | None = Field(default=None, max_length=webhooks.MAX_DESCRIPTION)


CREATE_FIELDS = frozenset(CreateWebhookRequest.model_fields)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WebhookEndpoint(_Body):
    id: uuid.UUID
    url: str
    events: list[str]
    description: str | None
    enabled: bool
    created_at: str
    disabled_at: str | None
    disabled_reason: str | None


class WebhookEndpointCreated(WebhookEndpoint):
    secret: str


class WebhookDelivery(_Body):
    webhook_id: str
    type: str
    job_id: uuid.UUID | None
    attempt: int
    outcome: str
    status_code: int | None
    duration_ms: int | None
    error: str | None
    created_at: str
    attempted_at: str | None
    next_retry_at: str | None


# --- checks ---------------------------------------------------------------------------------

def endpoint_id_param(raw: str) -> str:
    # A malformed id names no endpoint: 404, like an id that is not the caller's.
    if not UUID_RE.fullmatch(raw):
        raise NotFound("webhook endpoint not found")
    return raw.lower()


def parse_create(body: bytes) -> CreateWebhookRequest:
    try:
        return CreateWebhookRequest.model_validate_json(body)
    except ValidationError as exc:
        raise _create_error(exc) from None


def _create_error(exc: ValidationError) -> BadRequest:
    errors = exc.errors(include_url=False, include_context=False)
    for err in errors:
        if err["type"] == "json_invalid":
            reason = err["msg"].removeprefix("Invalid JSON: ")
            return BadRequest(f"request body is not valid JSON: {reason}", code="invalid_json")
        if err["loc"] == ():
            return BadRequest('request body must be a JSON object: {"url": "https://...", '
                              '"events": [...], "description": "..."}')
    unknown = sorted(str(err["loc"][0]) for err in errors if err["type"] == "extra_forbidden")
    if unknown:
        allowed = sorted(CREATE_FIELDS)
        return BadRequest(f"unknown field(s): {', '.join(unknown)}; "
                          f"allowed fields: {', '.join(allowed)}", code="unknown_field",
                          detail={"unknown_fields": unknown, "allowed_fields": allowed})
    messages = {
        "url": "url is required: the https:// address to deliver to",
        "events": f"events must be a list of event names: {_EVENT_CHOICES}",
        "description": f"description must be a string of at most {webhooks.MAX_DESCRIPTION} "
                       "characters",
    }
    details: list[dict[str, str]] = []
    for err in errors:
        field = str(err["loc"][0]) if err["loc"] else ""
        message = messages.get(field, err["msg"])
        if field == "url" and err["type"] != "missing":
            message = "url must be a string"
        if not any(d["field"] == field for d in details):
            details.append({"field": field, "path": field, "message": message})
    return BadRequest("; ".join(d["message"] for d in details), detail=details)


def check_events(events: list[str] | None) -> list[str]:
    if events is None:
        return list(webhooks.DEFAULT_EVENTS)
    if not events:
        raise BadRequest(f"events must not be empty; choose from {_EVENT_CHOICES} "
                         "(leave it out for job.succeeded, job.failed, job.cancelled)")
    allowed = {*webhooks.EVENT_TYPES, webhooks.ALL_EVENTS}
    unknown = [e for e in events if e not in allowed]
    if unknown:
        shown = ", ".join(json.dumps(e) for e in unknown[:5])
        raise BadRequest(f"unknown event(s): {shown}; choose from {_EVENT_CHOICES}",
                         code="unknown_event", detail={"unknown_events": unknown[:20],
                                                       "allowed_events": sorted(allowed)})
    return list(dict.fromkeys(events))


def _has_nul(*values: str | None) -> bool:
    return any(v is not None and "\x00" in v for v in values)


# --- the handlers ---------------------------------------------------------------------------

class WebhooksApi:
    def __init__(self, settings: Settings, db: dbmod.Database) -> None:
        self.settings = settings
        self.db = db
        self.max_body = min(settings.max_body_bytes, 65_536)
        self.allow_private = settings.webhooks_allow_private
        # A malformed SFTQ_WEBHOOKS_KEY turns POST /webhooks into a 503 that says so; the
        # rest of jobs-api keeps working.
        self.box: webhooks.SecretBox | None = None
        self.box_error = ""
        try:
            self.box = webhooks.SecretBox.from_settings(settings)
        except ValueError as exc:
            self.box_error = str(exc)
            logger.error("webhooks disabled: %s", exc)

    # POST /webhooks
    def create(self, request: Request) -> Response:
        key_hash = authenticate(request)
        check_json_content_type(request)
        req = parse_create(request.read_body(self.max_body))
        events = check_events(req.events)
        if _has_nul(req.url, req.description, *events):
            raise BadRequest("strings must not contain the NUL character (\\u0000)")
        if self.box is None or not self.box.can_seal:
            why = f" ({self.box_error})" if self.box_error else ""
            raise webhooks.NotConfigured("webhooks are not configured on this server: it needs "
                                         f"a valid SFTQ_WEBHOOKS_KEY to store signing secrets{why}")
        # Authenticated before the URL is resolved: a stranger must not make us look names up.
        self.db.fetchone(dbmod.API_WEBHOOK_PRECHECK, (key_hash,))
        try:
            webhooks.check_destination(req.url, allow_private=self.allow_private)
        except webhooks.BadUrl as exc:
            raise BadRequest(str(exc), code="invalid_url") from None
        except webhooks.DestinationRefused as exc:
            raise BadRequest(f"url is refused: {exc}; webhooks go only to public https "
                             "addresses", code="refused_destination") from None
        endpoint_id = str(uuid.uuid4())
        secret = webhooks.new_secret()
        sealed = self.box.seal(secret, endpoint_id)
        body = one_row(self.db.fetchone(dbmod.API_WEBHOOK_CREATE, (
            key_hash, endpoint_id, req.url, events, req.description, sealed)))[0]
        # The one answer that carries the secret; the database never had it in the clear.
        created = body[:-1] + ', "secret": ' + json.dumps(secret) + "}"
        headers = [*JSON_HEADERS, ("Location", f"{request.script_name}/webhooks/{endpoint_id}"),
                   ("Cache-Control", "no-store")]
        return Response(201, created.encode(), headers)

    # GET /webhooks
    def list(self, request: Request) -> Response:
        key_hash = authenticate(request)
        body = one_row(self.db.fetchone(dbmod.API_WEBHOOK_LIST, (key_hash,)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))

    # GET /webhooks/{id}
    def get(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        endpoint_id = endpoint_id_param(raw_id)
        body = one_row(self.db.fetchone(dbmod.API_WEBHOOK_GET, (key_hash, endpoint_id)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))

    # DELETE /webhooks/{id}
    def delete(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        endpoint_id = endpoint_id_param(raw_id)
        self.db.fetchone(dbmod.API_WEBHOOK_DELETE, (key_hash, endpoint_id))
        return Response(204)

    # POST /webhooks/{id}/test
    def test(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        endpoint_id = endpoint_id_param(raw_id)
        body = one_row(self.db.fetchone(dbmod.API_WEBHOOK_TEST, (key_hash, endpoint_id)))[0]
        return Response(202, body.encode(), list(JSON_HEADERS))

    # GET /webhooks/{id}/deliveries
    def deliveries(self, request: Request, raw_id: str) -> Response:
        key_hash = authenticate(request)
        endpoint_id = endpoint_id_param(raw_id)
        query = check_query(request, frozenset({"limit"}))
        limit = limit_param(query, DEFAULT_DELIVERIES, MAX_DELIVERIES)
        body = one_row(self.db.fetchone(dbmod.API_WEBHOOK_DELIVERIES,
                                      (key_hash, endpoint_id, limit)))[0]
        return Response(200, body.encode(), list(JSON_HEADERS))
