"""The raw HTTP sender: one POST to an address that was checked (never resolved again),
10 s for the whole exchange, redirects never followed, at most 64 KiB of the answer read."""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sftq_server.webhooks.destinations import Target

if TYPE_CHECKING:
    import ssl


logger = logging.getLogger("sftq.webhooks")

TIMEOUT_SECONDS = 10.0
MAX_RESPONSE_BYTES = 64 * 1024
USER_AGENT = "finetune-queue-webhooks/1"


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
