"""Helpers for the webhook tests: a loopback receiver that records what it got and answers as
told, a fake resolver (no test asks a real DNS server anything), a connector that refuses
everything but loopback, and verification with the specification's own library."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import standardwebhooks

from sftq_server import webhooks

# A public address that no test ever connects to: the fake resolver hands it out and
# `loopback_connector` maps it to a loopback receiver.
PUBLIC_IP = "93.184.215.14"
WEBHOOKS_KEY = "test-webhooks-key-0123456789abcdef0123456789"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def json(self) -> Any:
        return json.loads(self.body)


Reply = tuple[int, dict[str, str], bytes]


@dataclass
class Receiver:
    """A threaded HTTP server on 127.0.0.1 recording every request.

    `replies` answers the next requests in order (then 204); `hold` (an Event) makes the
    handler wait for it after recording the request and before answering.
    """

    replies: list[Reply | int] = field(default_factory=list)
    hold: threading.Event | None = None
    tls: tuple[str, str] | None = None  # (certfile, keyfile): serve HTTPS
    received: list[Received] = field(default_factory=list)
    connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrived: threading.Condition = field(init=False)
    server: ThreadingHTTPServer = field(init=False)

    def __post_init__(self) -> None:
        self.arrived = threading.Condition(self.lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver.lock:
                    receiver.received.append(Received(
                        self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                        time.time()))
                    reply = receiver.replies.pop(0) if receiver.replies else 204
                    receiver.arrived.notify_all()
                if receiver.hold is not None:
                    receiver.hold.wait(30)
                status, headers, payload = (reply, {}, b"") if isinstance(reply, int) else reply
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(payload)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a deliverer killed mid-request: expected in some tests

            def verify_request(self, request: Any, client_address: Any) -> bool:
                with receiver.lock:
                    receiver.connections += 1
                return True

        self.server = Server(("127.0.0.1", 0), Handler)
        if self.tls is not None:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def wait_for(self, n: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self.lock:
            while len(self.received) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"expected {n} deliveries, got {len(self.received)}")
                self.arrived.wait(left)
            return list(self.received)

    def close(self) -> None:
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()
        self.server.server_close()


def self_signed(folder: Path, hostname: str) -> tuple[str, str]:
    """A certificate for hostname that is its own CA: (certfile, keyfile)."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    certfile, keyfile = folder / f"{hostname}.crt", folder / f"{hostname}.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return str(certfile), str(keyfile)


class FakeResolver:
    """Answers from a table; records every question. Unknown names do not resolve."""

    def __init__(self, table: dict[str, list[str]] | None = None) -> None:
        self.table = dict(table or {})
        self.asked: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.table:
            raise webhooks.DestinationRefused(f"{host} does not resolve")
        return list(self.table[host])


class Connections:
    """A connector that records every connection and refuses anything but loopback; an address
    in `redirect` is connected to the given loopback port instead (a stand-in for the public
    internet)."""

    def __init__(self, redirect: dict[str, int] | None = None) -> None:
        self.redirect = dict(redirect or {})
        self.made: list[tuple[str, int]] = []

    def __call__(self, address: str, port: int, timeout: float) -> socket.socket:
        self.made.append((address, port))
        if address in self.redirect:
            return webhooks.connect_tcp("127.0.0.1", self.redirect[address], timeout)
        if address not in ("127.0.0.1", "::1"):
            raise AssertionError(f"a test tried to connect to {address}:{port}")
        return webhooks.connect_tcp(address, port, timeout)


def verify(secret: str, got: Received) -> Any:
    """The delivery as the Standard Webhooks library reads it (raises if it does not verify)."""
    return standardwebhooks.Webhook(secret).verify(got.body, got.headers)


def secret_bytes(secret: str) -> bytes:
    assert secret.startswith("whsec_")
    return base64.b64decode(secret.removeprefix("whsec_"), validate=True)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)
