"""What the supervisor and the parts it starts share: the configuration, the error that stops
a start, exit codes, and small network helpers."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sftq_server.dev.pgcluster import signal_possible

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class StartupError(Exception):
    """The stack cannot start; the message says why and what to do."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Interrupted(Exception):
    """A stop signal arrived while starting."""


@dataclass(frozen=True)
class DevConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    simulator_port: int = 8090
    simulator_job_seconds: float = 60.0
    tick_interval: float = 30.0
    provider: str = "simulator"  # simulator | fireworks
    ready_timeout: float = 90.0
    stop_timeout: float = 10.0
    verbose: bool = False  # details in the log: provider requests, the ticker's own lines


def probe_host(host: str) -> str:
    """Where to reach a server bound to host: a wildcard bind is reached on loopback."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # Same option the servers use, so a port in TIME_WAIT after a restart counts as free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback URL we built)
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


# Whether a pid can be signalled (kill 0): the test PostgreSQL makes of a lock file's pid.
pid_alive = signal_possible
