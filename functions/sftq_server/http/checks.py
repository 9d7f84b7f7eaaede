"""The checks every route makes before it calls a procedure: the bearer key, path ids, headers,
query parameters. They refuse what can be refused without the database (a malformed key, an id
that is not a UUID, an unknown parameter) with the 4xx that says what to fix.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from sftq_server.core.errors import (
    BadRequest,
    NotFound,
    SftqError,
    Unauthorized,
    UnsupportedMediaType,
)
from sftq_server.http.models import MAX_IDEMPOTENCY_KEY
from sftq_server.http.web import Request

# Keys are "sftq_" + 48 hex today; a little slack for other key generations, but nothing that
# could not be a key gets hashed and sent to the database.
_KEY_RE = re.compile(r"sftq_[A-Za-z0-9_-]{8,200}")
# Canonical 8-4-4-4-12 only: uuid.UUID would also take braces, urn: and bare hex.
UUID_RE = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
_LIMIT_RE = re.compile(r"[0-9]{1,4}")
_IDEMPOTENCY_RE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
_KEY_PREFIX_LEN = 13  # what sftq.api_keys.prefix stores: safe to log, useless to an attacker


def authenticate(request: Request) -> bytes:
    """The SHA-256 of a well-formed bearer key (the database decides whether it is valid)."""
    auth = request.headers.get("authorization")
    if not auth:
        raise Unauthorized("missing Authorization header; send Authorization: Bearer sftq_...")
    scheme, _, key = auth.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise Unauthorized("Authorization must be: Bearer sftq_...")
    if not _KEY_RE.fullmatch(key):
        raise Unauthorized("malformed API key; keys start with sftq_")
    request.user = key[:_KEY_PREFIX_LEN]
    return hashlib.sha256(key.encode()).digest()


def job_id_param(request: Request, raw: str) -> str:
    # A malformed id names no job: 404 like any other id that is not the caller's.
    if not UUID_RE.fullmatch(raw):
        raise NotFound("job not found")
    job_id = raw.lower()
    request.job_id = job_id
    return job_id


def idempotency_key(request: Request) -> str | None:
    key: str | None = request.headers.get("idempotency-key")
    if key is None:
        return None
    if len(key) > MAX_IDEMPOTENCY_KEY or not _IDEMPOTENCY_RE.fullmatch(key):
        raise BadRequest(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII "
                         "characters")
    return key


def check_json_content_type(request: Request) -> None:
    ctype: str = request.headers.get("content-type", "")
    media, _, params = ctype.partition(";")
    if media.strip().lower() != "application/json":
        raise UnsupportedMediaType("Content-Type must be application/json")
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
                "utf-8", "utf8"):
            raise UnsupportedMediaType("JSON bodies must be UTF-8 (charset=utf-8)")


def check_query(request: Request, allowed: frozenset[str]) -> dict[str, str]:
    """The query parameters, refusing unknown and repeated ones (400)."""
    query = request.query
    unknown = query.keys() - allowed
    if unknown:
        allowed_text = ", ".join(sorted(allowed)) if allowed else "none"
        raise BadRequest(f"unknown query parameter(s): {', '.join(sorted(unknown))}; "
                         f"allowed: {allowed_text}")
    if request.repeated_params:
        raise BadRequest(f"query parameter(s) given more than once: "
                         f"{', '.join(sorted(request.repeated_params))}")
    return query


def limit_param(query: dict[str, str], default: int | None, maximum: int) -> int | None:
    """`limit` as an integer from 1 to maximum (400 otherwise), or `default` when absent."""
    raw_limit = query.get("limit")
    if raw_limit is None:
        return default
    if not _LIMIT_RE.fullmatch(raw_limit) or not 1 <= int(raw_limit) <= maximum:
        raise BadRequest(f"limit must be an integer from 1 to {maximum}")
    return int(raw_limit)


def upper(value: str | None) -> str | None:
    return None if value is None else value.upper()


def one_row(row: tuple[Any, ...] | None) -> tuple[Any, ...]:
    """A procedure's answer row; a missing one (never expected) is a 500, not a crash later."""
    if row is None or row[0] is None:
        raise SftqError("the database answered no row")
    return row
