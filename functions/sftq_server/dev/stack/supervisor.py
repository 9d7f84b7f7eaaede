"""The supervisor of `sftq dev`: it owns every part it starts, in order, watches them, and
stops them all on every way out (a signal, a child that dies, a failed start).

The parts live next door: the database (database.py), the child processes (children.py, whose
stack_children is the one table of what runs) and the printed lines and env file
(sftq_server.dev.envfile, whose ENV_LINES is the one table of what is printed).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import IO, Any

from sftq_server.dev.envfile import StackFacts, env_lines, env_values, read_env_file, write_env_file
from sftq_server.dev.stack.children import (
    Child,
    ChildSpec,
    dead_child,
    spawn,
    stack_children,
    stop_children,
)
from sftq_server.dev.stack.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    DevConfig,
    Interrupted,
    StartupError,
    http_ok,
    port_free,
    probe_host,
    url_host,
)
from sftq_server.dev.stack.database import DevDatabase

DEMO_USER = "demo"


class DevStack:
    def __init__(
        self, config: DevConfig, *, stdout: IO[str] | None = None, stderr: IO[str] | None = None
    ) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.children: list[Child] = []
        self.database = DevDatabase(self.data_dir, self.log, self._check_stop)
        self.values: dict[str, str] = {}
        self._specs: list[ChildSpec] = []
        self._stop = threading.Event()
        self._stop_reason = ""
        self._lock_file: IO[str] | None = None

    # -- output ----------------------------------------------------------------------
    def log(self, message: str) -> None:
        print(f"sftq dev: {message}", file=self.stderr, flush=True)

    def emit(self, line: str) -> None:
        try:
            print(line, file=self.stdout, flush=True)
        except BrokenPipeError:
            # Whoever read our stdout has gone (`sftq dev | head -1`); the stack still runs.
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.stdout.fileno())

    # -- the whole life --------------------------------------------------------------
    def run(self) -> int:
        previous = self._install_signal_handlers()
        try:
            try:
                self._start()
            except Interrupted:
                self.log(f"{self._stop_reason}: stopping before the stack was ready")
                return EXIT_OK
            except StartupError as exc:
                if self._stop.is_set():
                    # A terminal's Ctrl-C also reaches pg_ctl while it starts the database,
                    # which then fails: the user's stop, not an error.
                    self.log(f"{self._stop_reason}: stopping before the stack was ready")
                    return EXIT_OK
                self.log(f"error: {exc}")
                return exc.exit_code
            self.emit("ready")
            self.log(
                f"ready: functions at {self.values['SUPABASE_URL']}/functions/v1/<name>; "
                "Ctrl-C stops everything"
            )
            return self._supervise()
        finally:
            self._shutdown()
            self._release_lock()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _install_signal_handlers(self) -> dict[signal.Signals, Any]:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            if not self._stop.is_set():
                self._stop_reason = f"got {signal.Signals(signum).name}"
            self._stop.set()

        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                previous[sig] = signal.signal(sig, on_signal)
        return previous

    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop from another thread (tests); a signal does the same."""
        self._stop_reason = reason
        self._stop.set()

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise Interrupted

    # -- starting --------------------------------------------------------------------
    def _start(self) -> None:
        cfg = self.config
        if cfg.provider == "fireworks":
            missing = [
                n for n in ("FIREWORKS_API_KEY", "FIREWORKS_ACCOUNT_ID") if not os.environ.get(n)
            ]
            if missing:
                raise StartupError(
                    "--provider fireworks needs "
                    + " and ".join(missing)
                    + " in the environment (the API key and the account id of your Fireworks "
                    "account); or leave out --provider to use the simulator",
                    EXIT_USAGE,
                )
        elif cfg.provider != "simulator":
            raise StartupError(
                f"unknown provider {cfg.provider!r}: simulator or fireworks", EXIT_USAGE
            )
        # The data dir's lock first: a second `sftq dev` in the same folder is told that,
        # not that the first one's ports are taken.
        self._prepare_data_dir()
        self._check_ports()
        saved = read_env_file(self.data_dir)
        database_url = self.database.start(saved)
        self._check_stop()
        self.database.migrate()
        self._check_stop()

        from sftq_server.dev import admin as admin

        tick_secret = saved.get("SFTQ_TICK_SECRET") or secrets.token_urlsafe(32)
        try:
            api_key, issued = admin.ensure_user_key(
                database_url, DEMO_USER, saved.get("SFTQ_API_KEY")
            )
        except admin.AdminError as exc:
            raise StartupError(f"could not set up the demo user: {exc.message}") from exc
        self.log(
            f"issued a key for the demo user {DEMO_USER!r}"
            if issued
            else f"reusing the demo user's key from {self.data_dir / 'env'}"
        )

        facts = StackFacts(
            base_url=f"http://{url_host(cfg.host)}:{cfg.port}",
            local_base=f"http://{url_host(probe_host(cfg.host))}:{cfg.port}",
            database_url=database_url,
            simulator_url=(
                f"http://127.0.0.1:{cfg.simulator_port}" if cfg.provider == "simulator" else ""
            ),
            tick_secret=tick_secret,
            api_key=api_key,
        )
        self.values = env_values(facts)
        lines = env_lines(self.values)
        for line in lines:
            self.emit(line)
        path = write_env_file(self.data_dir, lines)
        self.log(f"wrote {path} (source it in another shell)")

        self._specs = stack_children(cfg, facts, str(self.data_dir))
        for spec in self._specs:
            if not spec.after_ready:
                self._check_stop()
                self._spawn(spec)
        self._wait_ready()
        self._check_stop()
        for spec in self._specs:
            if spec.after_ready:
                self._spawn(spec)
        if cfg.tick_interval <= 0:
            self.log("ticker off (--tick-interval 0): tick with POST /functions/v1/scheduler-tick")

    def _check_ports(self) -> None:
        cfg = self.config
        wanted = [("--port", cfg.host, cfg.port)]
        if cfg.provider == "simulator":
            wanted.append(("--simulator-port", "127.0.0.1", cfg.simulator_port))
        if (
            cfg.provider == "simulator"
            and cfg.port == cfg.simulator_port
            and cfg.host in ("127.0.0.1", "0.0.0.0", "")
        ):
            raise StartupError("--port and --simulator-port must differ", EXIT_USAGE)
        for flag, host, port in wanted:
            if not port_free(host, port):
                raise StartupError(
                    f"{host}:{port} is already in use (another `sftq dev`?); "
                    f"pick another with {flag}",
                    EXIT_USAGE,
                )

    def _prepare_data_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # The folder holds a key, the tick secret and the database password: ours alone. (As
        # root the embedded cluster lives outside it; see DevDatabase._cluster_folder.)
        os.chmod(self.data_dir, 0o700)
        lock_path = self.data_dir / "dev.lock"
        lock = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115 (held for the whole run)
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise StartupError(
                    f"{self.data_dir} is in use by another `sftq dev` "
                    f"(pid {holder}); stop it first or use another --data-dir"
                ) from exc
            raise
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock_file = lock

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                self._lock_file.seek(0)
                self._lock_file.truncate()
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    # -- children --------------------------------------------------------------------
    def _spawn(self, spec: ChildSpec) -> Child:
        # Children write to our stderr: stdout stays the machine-readable channel.
        try:
            out = self.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            out = 2
        child = spawn(spec, out)
        self.children.append(child)
        self.log(f"started {spec.name} (pid {child.proc.pid})")
        return child

    def _wait_ready(self) -> None:
        cfg = self.config
        checks: dict[str, Callable[[], bool]] = {"database": self.database.answers}
        for spec in self._specs:
            if spec.ready_url and not spec.after_ready:
                checks[spec.name] = functools.partial(http_ok, spec.ready_url)
        deadline = time.monotonic() + cfg.ready_timeout
        while checks:
            self._check_stop()
            dead = dead_child(self.children)
            if dead is not None:
                raise StartupError(
                    f"the {dead.name} exited while starting "
                    f"(code {dead.proc.returncode}); see its messages above"
                )
            for part, check in list(checks.items()):
                if check():
                    del checks[part]
            if checks and time.monotonic() > deadline:
                raise StartupError(
                    f"not ready after {cfg.ready_timeout:g}s: {', '.join(checks)} did not answer"
                )
            if checks:
                self._stop.wait(0.1)

    # -- running ---------------------------------------------------------------------
    def _supervise(self) -> int:
        next_db_check = time.monotonic() + 2.0
        while not self._stop.wait(0.25):
            dead = dead_child(self.children)
            if dead is not None:
                self.log(
                    f"error: the {dead.name} (pid {dead.proc.pid}) exited unexpectedly with "
                    f"code {dead.proc.returncode}; stopping everything"
                )
                return EXIT_FAILED
            if time.monotonic() > next_db_check:
                next_db_check = time.monotonic() + 2.0
                if self.database.embedded_stopped():
                    self.log(
                        "error: the embedded PostgreSQL stopped unexpectedly; stopping everything"
                    )
                    return EXIT_FAILED
        self.log(f"{self._stop_reason or 'stop requested'}: stopping")
        return EXIT_OK

    # -- stopping --------------------------------------------------------------------
    def _shutdown(self) -> None:
        stop_children(self.children, self.config.stop_timeout, self.log)
        self.children.clear()
        self.database.stop()
