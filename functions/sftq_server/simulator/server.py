"""The simulator as a server: on a background thread for tests (`SimulatorServer`), or
blocking until a signal for `sftq simulator` and `python -m sftq_server.simulator`."""

from __future__ import annotations

import logging
import signal
import socket
import socketserver
import sys
import threading
from collections.abc import Sequence
from types import FrameType, TracebackType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from sftq_server.simulator.app import Simulator
from sftq_server.simulator.store import StateFileError

logger = logging.getLogger("sftq_server.simulator")


class _QuietHandler(WSGIRequestHandler):
    """wsgiref's handler, logging through `logging` at debug instead of onto stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("simulator %s - %s", self.address_string(), format % args)

    def address_string(self) -> str:
        return str(self.client_address[0])


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    # Non-daemon handler threads joined on close: stop() leaves no thread behind. wsgiref
    # answers one request per connection, so no idle keep-alive connection can hold a join.
    daemon_threads = False
    block_on_close = True
    # socketserver's default backlog of 5 drops SYNs under a burst of parallel clients, and
    # each drop costs the client a one-second retransmit.
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (our injected timeouts) closes its socket mid-answer.
        logger.debug("simulator: error serving %s", client_address, exc_info=True)


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class SimulatorServer:
    """The simulator on a background thread, for tests: `with SimulatorServer() as srv:`."""

    def __init__(
        self, simulator: Simulator | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.simulator = simulator if simulator is not None else Simulator()
        self.host = host
        self.port = port
        self._server: _ThreadingServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the simulator server is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> SimulatorServer:
        if self._server is not None:
            return self
        server_class = _ThreadingServer6 if ":" in self.host else _ThreadingServer
        server = server_class((self.host, self.port), _QuietHandler)
        server.set_app(self.simulator)
        self.port = int(server.server_address[1])
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=f"sftq-simulator-{self.port}",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = self._thread = None
        self.simulator._release_sleepers()
        server.shutdown()
        if thread is not None:
            thread.join()
        server.server_close()

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve(
    host: str,
    port: int,
    job_seconds: float,
    account_id: str = "sim-account",
    max_value: int = 64,
    state_file: str | None = None,
) -> None:
    """Run the simulator until SIGTERM or SIGINT (blocking); for `sftq simulator`.

    `state_file`: keep the account (jobs, quota, resources, faults) in that file and pick it up
    again on the next start (StateFileError when it cannot be read); None: in memory only.
    """
    simulator = Simulator(account_id=account_id, job_seconds=job_seconds, max_value=max_value,
                          state_file=state_file)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    server = SimulatorServer(simulator, host=host, port=port).start()
    try:
        print(f"simulator listening on {server.url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sftq_server.simulator [--host H] [--port N] [--job-seconds S] ...`."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="sftq-simulator",
        description="A Fireworks control plane (in memory, or kept in --state-file), served "
        "over real HTTP.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--job-seconds", type=float, default=60.0)
    parser.add_argument("--account-id", default="sim-account")
    parser.add_argument("--max-value", type=int, default=64)
    parser.add_argument("--state-file", default=None, metavar="PATH",
                        help="keep the account in this file across restarts (default: memory)")
    args = parser.parse_args(argv)
    try:
        serve(args.host, args.port, args.job_seconds, args.account_id, args.max_value,
              args.state_file)
    except StateFileError as exc:
        print(f"sftq-simulator: error: {exc}", file=sys.stderr)
        return 2
    return 0
