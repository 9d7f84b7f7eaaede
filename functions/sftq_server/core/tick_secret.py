"""The tick secret: what scheduler-tick, webhook-deliver and the operators' routes accept as a
bearer (the secret itself, or a short-lived token of it that pg_cron mints) and how strong it
must be to start with."""

from __future__ import annotations

import hashlib
import hmac
import re
import time

from sftq_server.core.settings import Settings

MIN_SECRET_CHARS = 32
TOKEN_WINDOW_SECONDS = 120
_TOKEN = re.compile(r"v1\.([0-9]{1,12})\.([0-9a-f]{64})")


class TickSecretError(ValueError):
    """The tick secret is too weak to run with; the message says what to do."""


def tick_secret_problem(settings: Settings) -> str | None:
    """Why scheduler-tick must not run with this secret, or None. An empty secret is not a
    problem here: the endpoint then answers 503 not_configured, as it always has."""
    secret = settings.tick_secret
    if secret and len(secret) < MIN_SECRET_CHARS and not settings.dev_stack:
        return (f"SFTQ_TICK_SECRET is {len(secret)} characters long: scheduler-tick needs at "
                f"least {MIN_SECRET_CHARS} outside the dev stack; generate one with "
                "`openssl rand -hex 32` and store it in both places (infra/deploy.sh secrets "
                "--only tick-secret, then cron)")
    return None


def require_tick_secret(settings: Settings) -> None:
    """Raise TickSecretError when the secret is too short: called where a host starts."""
    problem = tick_secret_problem(settings)
    if problem:
        raise TickSecretError(problem)


def tick_token(secret: str, now: float | None = None) -> str:
    """The short-lived bearer token for `secret` at `now` (default: this host's clock)."""
    seconds = str(int(time.time() if now is None else now))
    mac = hmac.new(secret.encode(), seconds.encode(), hashlib.sha256).hexdigest()
    return f"v1.{seconds}.{mac}"


def bearer_ok(token: str, secret: str, now: float) -> bool:
    """The bearer is the secret, or a token of it minted within TOKEN_WINDOW_SECONDS of now."""
    plain = hmac.compare_digest(token.encode(), secret.encode())
    match = _TOKEN.fullmatch(token)
    minted = False
    if match is not None and abs(now - int(match[1])) <= TOKEN_WINDOW_SECONDS:
        expected = hmac.new(secret.encode(), match[1].encode(), hashlib.sha256).hexdigest()
        minted = hmac.compare_digest(match[2].encode(), expected.encode())
    return plain or minted
