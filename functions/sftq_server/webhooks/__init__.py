"""Webhook delivery: sealed secrets, destination checks, Standard Webhooks signatures, the
pinned HTTP sender, and the deliverer that drains the outbox (sql/procedures/120_webhooks.sql).

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

import base64
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from sftq_server.core.errors import SftqError

if TYPE_CHECKING:
    import ssl

    from sftq_server.core.settings import Settings
    from sftq_server.db import Database

logger = logging.getLogger("sftq.webhooks")

EVENT_TYPES: tuple[str, ...] = (
    "job.queued", "job.admitted", "job.succeeded", "job.failed", "job.cancelled")
ALL_EVENTS = "job.*"
DEFAULT_EVENTS: tuple[str, ...] = ("job.succeeded", "job.failed", "job.cancelled")
TEST_EVENT = "webhook.test"
MAX_ENDPOINTS = 10
MAX_URL_LENGTH = 2048
MAX_DESCRIPTION = 500

TIMEOUT_SECONDS = 10.0
MAX_RESPONSE_BYTES = 64 * 1024
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
USER_AGENT = "finetune-queue-webhooks/1"

# Deliverer defaults: overall and per-endpoint concurrency, and how long a claim holds a row
# (longer than one attempt can take: the 10 s exchange plus DNS and recording).
DEFAULT_CONCURRENCY = 16
DEFAULT_PER_ENDPOINT = 4
DEFAULT_LEASE_SECONDS = 60.0
DEFAULT_POLL_SECONDS = 0.25
RETENTION_DAYS = 30
PRUNE_EVERY_SECONDS = 3600.0


# --- signing secrets -------------------------------------------------------------------------

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


# --- destinations ----------------------------------------------------------------------------

class BadUrl(ValueError):
    """The URL is not one we deliver to; the message is for the user."""


class DestinationRefused(Exception):
    """The destination resolves to an address we never connect to; the message is for the user."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # IDNA (ASCII), lower case; an IP literal without brackets
    port: int
    path: str  # path and query, as sent on the request line

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def label(self) -> str:
        """Safe to log and show: scheme, host and port, no path or query."""
        return f"{self.scheme}://{self.host_header}"


_CONTROL = re.compile(r"[\x00-\x20\x7f]")


def parse_url(url: str, *, allow_http: bool) -> Target:
    if not isinstance(url, str) or not url:
        raise BadUrl("url must be a non-empty string")
    if len(url) > MAX_URL_LENGTH:
        raise BadUrl(f"url must be at most {MAX_URL_LENGTH} characters")
    if _CONTROL.search(url):
        raise BadUrl("url must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise BadUrl("url is not a valid URL") from None
    scheme = parts.scheme.lower()
    allowed = ("https", "http") if allow_http else ("https",)
    if scheme not in allowed:
        raise BadUrl("url must start with https://" if not allow_http else
                     "url must start with https:// or http://")
    if port == 0:
        raise BadUrl("url's port must be from 1 to 65535")
    if "@" in parts.netloc:
        raise BadUrl("url must not contain a user name or password")
    if parts.fragment or url.endswith("#"):
        raise BadUrl("url must not contain a #fragment")
    host = parts.hostname or ""
    if not host:
        raise BadUrl("url must name a host")
    if not _is_ip(host):
        try:
            host = host.rstrip(".").encode("idna").decode("ascii").lower()
        except UnicodeError:
            raise BadUrl("url's host name is not valid") from None
        if not host or not re.fullmatch(r"[a-z0-9.-]+", host) or ".." in host:
            raise BadUrl("url's host name is not valid")
        # 127.1, 2130706433, 0x7f000001: resolvers read these as IPv4 addresses. No real top
        # level domain is a number, so a numeric last label must be a plain IPv4 address.
        if re.fullmatch(r"0x[0-9a-f]*|[0-9]+", host.rsplit(".", 1)[-1]):
            raise BadUrl("url's host is not a valid address: write an IPv4 address as four "
                         "decimal numbers")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    # The request line is ASCII: percent-encode anything else (existing escapes stay as they are).
    path = quote(path, safe="/%:@!$&'()*+,;=-._~?")
    return Target(scheme, host, port or (443 if scheme == "https" else 80), path)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for host (TCP)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise DestinationRefused(f"{host} does not resolve ({exc})") from None
    out: list[str] = []
    for info in infos:
        addr = str(info[4][0])
        if addr not in out:
            out.append(addr)
    return out


# Tests replace this (monkeypatch) so that no test ever asks a real DNS server anything.
default_resolver: Resolver = system_resolver

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METADATA = frozenset({"169.254.169.254", "169.254.170.2", "100.100.100.200", "192.0.0.192",
                       "fd00:ec2::254"})


def address_refusal(address: str) -> str | None:
    """Why we never connect to this address, or None when it is a public unicast address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "not a valid IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        # IPv4 carried inside IPv6 is judged as the IPv4 address it reaches.
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            reason = address_refusal(str(embedded))
            return f"{reason} (inside an IPv6 address)" if reason else None
    if str(ip) in _METADATA:
        return "a cloud metadata address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (where cloud metadata services live)"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved or not ip.is_global:
        return "not a public address"
    return None


def resolve_checked(target: Target, *, allow_private: bool,
                    resolver: Resolver | None = None) -> list[str]:
    """The addresses to connect to, all checked; DestinationRefused if any one is refused.

    All, not some: a name that answers one public and one private address would otherwise let
    the choice of address decide whether we reach the private one.
    """
    try:
        literal: str | None = str(ipaddress.ip_address(target.host))
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        addresses = (resolver or default_resolver)(target.host, target.port)
        if not addresses:
            raise DestinationRefused(f"{target.host} does not resolve")
    if not allow_private:
        for address in addresses:
            reason = address_refusal(address)
            if reason:
                # For a name, not the address it gave: no map of someone's internal DNS.
                shown = address if literal is not None else f"{target.host} resolves to"
                raise DestinationRefused(f"{shown} {'is ' if literal else ''}{reason}")
    return addresses


def check_destination(url: str, *, allow_private: bool,
                      resolver: Resolver | None = None) -> Target:
    """Everything POST /webhooks checks: the URL, and in production where it resolves to."""
    target = parse_url(url, allow_http=allow_private)
    if not allow_private:
        resolve_checked(target, allow_private=False, resolver=resolver)
    return target


# --- sending ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no HTTP answer (timeout, connection error, refused destination)
    error: str | None
    duration_ms: int


Connector = Callable[[str, int, float], socket.socket]


def connect_tcp(address: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to exactly this address (no name resolution)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((address, port))
    except BaseException:
        sock.close()
        raise
    return sock


_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9])(?: ([^\r\n]*))?")


def send(target: Target, addresses: Iterable[str], headers: list[tuple[str, str]], body: bytes,
         *, timeout: float = TIMEOUT_SECONDS, connector: Connector = connect_tcp,
         ssl_context: ssl.SSLContext | None = None) -> Answer:
    """POST body to target over a connection to one of the checked addresses.

    HTTP/1.1 written by hand so that nothing can re-resolve the name, follow a redirect or read
    more than MAX_RESPONSE_BYTES. The whole exchange is bounded by `timeout`: every socket call
    waits at most for what is left, and a watchdog closes the connection at the deadline.
    """
    started = time.monotonic()
    deadline = started + timeout

    def left() -> float:
        return max(0.001, deadline - time.monotonic())

    def answer(status: int | None, error: str | None) -> Answer:
        return Answer(status, error, int((time.monotonic() - started) * 1000))

    raw: socket.socket | None = None
    last_error = "no address to connect to"
    for address in addresses:
        try:
            raw = connector(address, target.port, left())
            break
        except TimeoutError:
            last_error = f"timed out connecting to {target.host_header}"
        except OSError as exc:
            last_error = f"could not connect to {target.host_header}: {exc.strerror or exc}"
        if time.monotonic() >= deadline:
            break
    if raw is None:
        return answer(None, last_error)

    import ssl as ssl_module

    # The watchdog shuts the connection down through a duplicate of its descriptor: wrapping
    # in TLS detaches `raw`, and the duplicate stays ours (no reuse of the number by another
    # thread's socket) until the finally below has cancelled the watchdog.
    guard = raw.dup()
    guard_lock = threading.Lock()
    finished = False

    def fire() -> None:
        with guard_lock:
            if not finished:
                _shutdown(guard)

    watchdog = threading.Timer(timeout + 0.5, fire)
    watchdog.daemon = True
    watchdog.start()
    sock: Any = raw
    try:
        if target.scheme == "https":
            context = ssl_context or _default_ssl_context()
            raw.settimeout(left())
            sock = context.wrap_socket(raw, server_hostname=target.host)
        head = [f"POST {target.path} HTTP/1.1", f"Host: {target.host_header}",
                f"User-Agent: {USER_AGENT}", "Content-Type: application/json",
                f"Content-Length: {len(body)}", "Connection: close",
                *(f"{k}: {v}" for k, v in headers)]
        sock.settimeout(left())
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        status, error = _read_status(sock, left)
        if status is None and time.monotonic() >= deadline:
            error = f"no answer within {timeout:g}s"
        return answer(status, error)
    except TimeoutError:
        return answer(None, f"no answer within {timeout:g}s")
    except OSError as exc:
        if time.monotonic() >= deadline:
            return answer(None, f"no answer within {timeout:g}s")
        if isinstance(exc, ssl_module.SSLError):
            return answer(None, f"TLS failed: {exc.reason or exc}")
        return answer(None, f"connection failed: {exc.strerror or type(exc).__name__}")
    finally:
        watchdog.cancel()
        with guard_lock:
            finished = True
        guard.close()
        sock.close()


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _read_status(sock: Any, left: Callable[[], float]) -> tuple[int | None, str | None]:
    """The final status of the answer, reading at most MAX_RESPONSE_BYTES in all."""
    buf = b""
    total = 0
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            match = _STATUS_LINE.match(buf)
            if match is None:
                return None, "the answer is not HTTP/1.x"
            status = int(match.group(1))
            if 100 <= status < 200:  # an interim answer (100 Continue, 103): the real one follows
                buf = buf[end + 4:]
                continue
            if 200 <= status < 300:
                return status, None
            reason = (match.group(2) or b"").decode("latin-1")[:100]
            error = f"HTTP {status} {reason}".rstrip()
            if 300 <= status < 400:
                error += " (redirects are not followed)"
            return status, error
        if total >= MAX_RESPONSE_BYTES:
            return None, f"no complete answer in the first {MAX_RESPONSE_BYTES // 1024} KiB"
        sock.settimeout(left())
        chunk: bytes = sock.recv(min(16384, MAX_RESPONSE_BYTES - total))
        if not chunk:
            return None, "the connection closed before a complete answer"
        total += len(chunk)
        buf += chunk


_ssl_lock = threading.Lock()
_ssl_context: ssl.SSLContext | None = None


def _default_ssl_context() -> ssl.SSLContext:
    global _ssl_context
    with _ssl_lock:
        if _ssl_context is None:
            import ssl as ssl_module

            _ssl_context = ssl_module.create_default_context()
        return _ssl_context


# --- the deliverer ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Claimed:
    delivery_id: int
    lease_token: str
    endpoint_id: str
    url: str
    secret_sealed: str
    webhook_id: str
    type: str
    body: str
    attempt: int


@dataclass(frozen=True)
class Outcome:
    webhook_id: str
    type: str
    destination: str  # scheme://host[:port], never the path or query
    attempt: int
    status: int | None
    error: str | None
    duration_ms: int
    result: str  # what sftq.webhook_record_attempt answered

    def line(self) -> str:
        answer = str(self.status) if self.status is not None else "no answer"
        text = (f"webhook {self.webhook_id} {self.type} attempt {self.attempt} -> "
                f"{self.destination}: {answer} in {self.duration_ms} ms, {self.result}")
        if self.error:
            text += f" ({self.error})"
        return text


class Deliverer:
    """Claims due deliveries, sends them with bounded concurrency, records each attempt.

    Any number of deliverers (processes, function instances) may run at once and any may die:
    a claim is a lease, so a row whose deliverer vanished is due again when its lease ends.
    At most `per_endpoint` deliveries per endpoint are held at once across all deliverers, and
    at most `concurrency` in this one, so a slow receiver holds a few slots, never all of them.
    """

    def __init__(self, db: Database, settings: Settings, *,
                 concurrency: int = DEFAULT_CONCURRENCY,
                 per_endpoint: int = DEFAULT_PER_ENDPOINT,
                 lease_seconds: float = DEFAULT_LEASE_SECONDS,
                 timeout: float = TIMEOUT_SECONDS,
                 resolver: Resolver | None = None,
                 connector: Connector = connect_tcp,
                 ssl_context: ssl.SSLContext | None = None,
                 on_outcome: Callable[[Outcome], None] | None = None) -> None:
        if concurrency < 1 or per_endpoint < 1:
            raise ValueError("concurrency and per_endpoint must be at least 1")
        if lease_seconds <= timeout + 1:
            raise ValueError("the lease must outlast an attempt: more than timeout + 1 s")
        self.db = db
        self.allow_private = settings.webhooks_allow_private
        self.box = SecretBox.from_settings(settings)
        self.concurrency = concurrency
        self.per_endpoint = per_endpoint
        self.lease_seconds = lease_seconds
        self.timeout = timeout
        self.resolver = resolver
        self.connector = connector
        self.ssl_context = ssl_context
        self.on_outcome = on_outcome
        self._next_prune = 0.0

    # -- one delivery --------------------------------------------------------------------

    def claim(self, limit: int) -> list[Claimed]:
        from sftq_server import db as dbmod

        rows = self.db.fetchall(dbmod.WEBHOOK_CLAIM,
                                (limit, self.per_endpoint, self.lease_seconds))
        return [Claimed(int(r[0]), str(r[1]), str(r[2]), r[3], r[4], r[5], r[6], r[7], int(r[8]))
                for r in rows]

    def attempt(self, row: Claimed) -> Answer:
        """Check the destination, sign, send: what the receiver answered (never raises)."""
        started = time.monotonic()

        def failed(error: str) -> Answer:
            return Answer(None, error, int((time.monotonic() - started) * 1000))

        try:
            target = parse_url(row.url, allow_http=self.allow_private)
            addresses = resolve_checked(target, allow_private=self.allow_private,
                                        resolver=self.resolver)
        except (BadUrl, DestinationRefused) as exc:
            return failed(f"destination refused: {exc}")
        try:
            secret = self.box.open(row.secret_sealed, row.endpoint_id)
        except NotConfigured as exc:
            logger.error("webhook %s: cannot sign: %s", row.webhook_id, exc.message)
            return failed("the server could not sign this delivery (its signing key is not "
                          "configured); it will retry")
        body = row.body.encode()
        # The signing timestamp is the attempt's (receivers reject old ones); webhook-id is the
        # delivery's, the same on every attempt.
        timestamp = int(time.time())
        headers = [("webhook-id", row.webhook_id), ("webhook-timestamp", str(timestamp)),
                   ("webhook-signature", sign(secret, row.webhook_id, timestamp, body))]
        return send(target, addresses, headers, body, timeout=self.timeout,
                    connector=self.connector, ssl_context=self.ssl_context)

    def deliver(self, row: Claimed) -> Outcome:
        from sftq_server import db as dbmod

        attempted_at = time.time()
        try:
            answer = self.attempt(row)
        except Exception:
            # A bug must not leave the row to come back at every lease expiry with nothing
            # recorded: record a failed attempt, so it backs off and shows up in the history.
            logger.exception("webhook %s: the attempt failed unexpectedly", row.webhook_id)
            answer = Answer(None, "internal error while sending; it will be retried",
                            int((time.time() - attempted_at) * 1000))
        result = self.db.scalar(dbmod.WEBHOOK_RECORD_ATTEMPT, (
            row.delivery_id, row.lease_token, answer.status, answer.error, answer.duration_ms,
            attempted_at))
        try:
            destination = parse_url(row.url, allow_http=True).label
        except BadUrl:
            destination = "(invalid url)"
        outcome = Outcome(row.webhook_id, row.type, destination, row.attempt, answer.status,
                          answer.error, answer.duration_ms, str(result))
        logger.info("%s", outcome.line())
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        return outcome

    def _deliver_logged(self, row: Claimed) -> Outcome | None:
        try:
            return self.deliver(row)
        except SftqError as exc:
            # The database went away between send and record: the lease runs out and the row
            # is sent again (at least once; receivers deduplicate by webhook-id).
            logger.warning("webhook %s: could not record the attempt: %s", row.webhook_id,
                           exc.message)
        except Exception:
            logger.exception("webhook %s: delivery failed unexpectedly", row.webhook_id)
        return None

    def prune(self, force: bool = False) -> int:
        from sftq_server import db as dbmod

        now = time.monotonic()
        if not force and now < self._next_prune:
            return 0
        self._next_prune = now + PRUNE_EVERY_SECONDS
        return int(self.db.scalar(dbmod.WEBHOOK_PRUNE, (RETENTION_DAYS,)) or 0)

    # -- loops ---------------------------------------------------------------------------

    def run(self, stop: threading.Event, *, poll_interval: float = DEFAULT_POLL_SECONDS,
            budget_seconds: float | None = None, until_idle: bool = False) -> int:
        """Deliver until `stop` is set, or `budget_seconds` pass, or (`until_idle`) nothing is
        due; then wait for the attempts in flight. Answers how many attempts were made.

        In the endless mode a failed claim (database away) is logged and retried; with
        `until_idle` (one pass of the delivery function) it is raised.
        """
        from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

        ends = None if budget_seconds is None else time.monotonic() + budget_seconds
        made = 0
        inflight: set[Future[Outcome | None]] = set()
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="sftq-webhook") as pool:
            while not stop.is_set() and (ends is None or time.monotonic() < ends):
                inflight = {f for f in inflight if not f.done()}
                free = self.concurrency - len(inflight)
                claimed: list[Claimed] = []
                if free > 0:
                    try:
                        claimed = self.claim(free)
                        self.prune()
                    except SftqError as exc:
                        if until_idle:
                            raise
                        logger.warning("webhooks: cannot claim deliveries: %s", exc.message)
                        stop.wait(max(poll_interval, 1.0))
                        continue
                for row in claimed:
                    inflight.add(pool.submit(self._deliver_logged, row))
                made += len(claimed)
                if until_idle and not claimed and not inflight:
                    break
                if claimed and len(claimed) == free:
                    continue  # a full batch: more may be due, claim again at once
                if inflight:
                    # An attempt ending frees a slot (and maybe its endpoint's turn).
                    wait(inflight, timeout=poll_interval, return_when=FIRST_COMPLETED)
                else:
                    stop.wait(poll_interval)
            wait(inflight)
        return made


# --- the delivery function (production: fired by pg_cron / pg_net) ---------------------------

class DeliverApp:
    """POST with the tick secret runs one delivery pass: until nothing is due, at most
    `budget_seconds`. pg_cron fires it every few seconds and a pg_net trigger right after a
    commit that wrote deliveries (cron/schedule_webhooks.sql); overlapping passes share the work
    through the claim's SKIP LOCKED. Answers {"attempts", "duration_ms"}."""

    def __init__(self, settings: Settings, *, db: Database | None = None,
                 budget_seconds: float = 20.0, **deliverer_options: Any) -> None:
        self.settings = settings
        self._db = db
        self.budget_seconds = budget_seconds
        self._options = deliverer_options
        self._deliverer: Deliverer | None = None
        self._lock = threading.Lock()

    def _get(self) -> Deliverer:
        with self._lock:
            if self._deliverer is None:
                from sftq_server.db import get_database

                db = self._db or get_database(self.settings.database_url,
                                              max_size=self.settings.db_pool_max,
                                              timeout=self.settings.db_timeout_seconds)
                self._deliverer = Deliverer(db, self.settings, **self._options)
            return self._deliverer

    def handle(self, method: str, authorization: str | None) -> tuple[int, dict[str, str], bytes]:
        def reply(status: int, body: dict[str, Any],
                  extra: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
            return status, {"Content-Type": "application/json", **(extra or {})}, \
                json.dumps(body).encode()

        if method.upper() != "POST":
            return reply(405, {"error": "use POST", "code": "method_not_allowed"},
                         {"Allow": "POST"})
        secret = self.settings.tick_secret
        if not secret:
            return reply(503, {"error": "SFTQ_TICK_SECRET is not set: refusing to deliver "
                                        "without it", "code": "not_configured"})
        # The same two bearer forms as scheduler-tick: the secret, or pg_cron's two-minute
        # token of it (cron/schedule_webhooks.sql never sends the secret through pg_net).
        from sftq_server.core.tick_secret import bearer_ok

        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not bearer_ok(token.strip(), secret, time.time()):
            return reply(401, {"error": "missing or wrong secret (Authorization: Bearer)",
                               "code": "unauthorized"}, {"WWW-Authenticate": "Bearer"})
        started = time.monotonic()
        try:
            attempts = self._get().run(threading.Event(), budget_seconds=self.budget_seconds,
                                       until_idle=True)
        except SftqError as exc:
            return reply(503, {"error": exc.message, "code": exc.code}, {"Retry-After": "5"})
        return reply(200, {"attempts": attempts,
                           "duration_ms": int((time.monotonic() - started) * 1000)})

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        status, headers, body = self.handle(str(environ.get("REQUEST_METHOD", "GET")),
                                            environ.get("HTTP_AUTHORIZATION"))
        from sftq_server.http.web import status_line

        start_response(status_line(status),
                       [*headers.items(), ("Content-Length", str(len(body)))])
        return [body]


def make_deliver_app(settings: Settings, *, db: Database | None = None,
                     **options: Any) -> DeliverApp:
    return DeliverApp(settings, db=db, **options)
