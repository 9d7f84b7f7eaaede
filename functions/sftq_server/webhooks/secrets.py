"""Signing secrets: new ones, Standard Webhooks signatures, and their sealing at rest
(AES-256-GCM under SFTQ_WEBHOOKS_KEY; the key never enters the database)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
from typing import TYPE_CHECKING, Any

from sftq_server.core.errors import SftqError

if TYPE_CHECKING:

    from sftq_server.core.settings import Settings

logger = logging.getLogger("sftq.webhooks")

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32


def new_secret() -> str:
    """A fresh signing secret: whsec_ + base64 of 32 random bytes (Standard Webhooks form)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def sign(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The webhook-signature value: v1,<base64 HMAC-SHA256 of "id.timestamp.body">.

    The standard library's hmac, as the specification spells it out; the tests hold it to the
    specification's own library (standardwebhooks) on every delivery.
    """
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    mac = hmac.new(key, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


class NotConfigured(SftqError):
    """The server cannot seal or open secrets: SFTQ_WEBHOOKS_KEY is missing or wrong."""

    status, code = 503, "webhooks_not_configured"


_SEALED_V1 = "v1"  # AES-256-GCM under a key from SFTQ_WEBHOOKS_KEY
_SEALED_PLAIN = "v0"  # only when no key is set and allow_private (the dev stack)


class SecretBox:
    """Seals endpoints' signing secrets for storage and opens them to sign.

    SFTQ_WEBHOOKS_KEY holds one or more keys (separated by commas or spaces), each at least 32
    characters of high entropy; the first seals, every one opens (key rotation: put the new key
    first, keep the old one until no endpoint uses it). The sealed form is
    ``v1:<key id>:<base64 nonce+ciphertext>`` with the endpoint id as associated data, so a
    sealed secret copied onto another endpoint does not open. Without a key, only the dev stack
    (allow_private) may store secrets as they are (``v0:``), readable by the database owner only.
    """

    def __init__(self, keys: str, *, allow_plain: bool = False) -> None:
        self._keys: dict[str, bytes] = {}
        self._first: str | None = None
        for raw in re.split(r"[,\s]+", keys.strip()):
            if not raw:
                continue
            if len(raw) < 32:
                raise ValueError("SFTQ_WEBHOOKS_KEY: each key must be at least 32 characters")
            kid = hashlib.sha256(b"sftq-webhooks-key-id\0" + raw.encode()).hexdigest()[:8]
            self._keys[kid] = hashlib.sha256(b"sftq-webhooks-seal\0" + raw.encode()).digest()
            self._first = self._first or kid
        self.allow_plain = allow_plain

    @classmethod
    def from_settings(cls, settings: Settings) -> SecretBox:
        return cls(settings.webhooks_key, allow_plain=settings.webhooks_allow_private)

    @property
    def can_seal(self) -> bool:
        return self._first is not None or self.allow_plain

    def seal(self, secret: str, endpoint_id: str) -> str:
        if self._first is None:
            if not self.allow_plain:
                raise NotConfigured("webhooks are not configured on this server: it needs "
                                    "SFTQ_WEBHOOKS_KEY to store signing secrets")
            return f"{_SEALED_PLAIN}:{secret}"
        AESGCM = _aesgcm()  # noqa: N806 - the class's own name
        nonce = secrets.token_bytes(12)
        sealed = AESGCM(self._keys[self._first]).encrypt(
            nonce, secret.encode(), endpoint_id.encode())
        return f"{_SEALED_V1}:{self._first}:{base64.b64encode(nonce + sealed).decode()}"

    def open(self, sealed: str, endpoint_id: str) -> str:
        version, _, rest = sealed.partition(":")
        if version == _SEALED_PLAIN:
            return rest
        if version != _SEALED_V1:
            raise NotConfigured("a signing secret is sealed in an unknown format")
        kid, _, data = rest.partition(":")
        key = self._keys.get(kid)
        if key is None:
            raise NotConfigured(f"a signing secret is sealed with key {kid}, which is not in "
                                "SFTQ_WEBHOOKS_KEY")
        AESGCM = _aesgcm()  # noqa: N806 - the class's own name
        from cryptography.exceptions import InvalidTag

        raw = base64.b64decode(data)
        try:
            opened: bytes = AESGCM(key).decrypt(raw[:12], raw[12:], endpoint_id.encode())
        except InvalidTag:
            raise NotConfigured("a signing secret does not open with its key") from None
        return opened.decode()


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        # A deployment that left the package out: a clear 503, not a 500 with a traceback.
        raise NotConfigured("webhooks need the cryptography package on this server "
                            "(pip install 'finetune-queue[server]')") from None
    return AESGCM
