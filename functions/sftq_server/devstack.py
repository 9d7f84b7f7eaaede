"""`sftq dev`: the whole system on one machine, started, watched and stopped as one.

The supervisor owns every part it starts: the embedded PostgreSQL (through LocalCluster;
skipped when DATABASE_URL is given), and three children, each in its own process group so
a Ctrl-C in the terminal reaches only the supervisor, which then stops them in order:

    simulator  python -m sftq_server.simulator          (unless --provider fireworks)
    gateway    python -m sftq_server.cli_dev serve      (the three functions behind one port)
    ticker     python -m sftq_server.cli_dev ticker     (unless --tick-interval 0)

Whatever was started is stopped on every way out: a signal, a child that dies, a failed
start. Children also get SIGTERM from the kernel if the supervisor itself is killed -9.

State kept in the data dir, so a restart looks the same from outside: the PostgreSQL
cluster and the port it listens on (pg.port), and the env file, whose SFTQ_TICK_SECRET and
SFTQ_API_KEY are reused (the key cannot be recovered from the database, which keeps only
its hash). stdout carries only the KEY=value lines and `ready`; progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from .devenv import read_env_file

DEFAULT_PG_PORT = 54329
DEMO_USER = "demo"
DATABASE_NAME = "sftq"
# The simulator accepts any bearer key; the provider client still wants one to send.
SIMULATOR_API_KEY = "sim-placeholder-key"
SIMULATOR_ACCOUNT = "sim-account"
ENV_NAMES = ("SUPABASE_URL", "DATABASE_URL", "SIMULATOR_URL", "SFTQ_TICK_SECRET", "SFTQ_API_KEY",
             "DASHBOARD_URL")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class StartupError(Exception):
    """The stack cannot start; the message says why and what to do."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Interrupted(Exception):
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


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    argv: list[str] = field(default_factory=list)


def server_command(*args: str) -> list[str]:
    """argv running a server subcommand with this interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "sftq_server.cli_dev", *args]


def _probe_host(host: str) -> str:
    """Where to reach a server bound to host: a wildcard bind is reached on loopback."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def _url_host(host: str) -> str:
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


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback URL we built)
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _death_signal_hook() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGTERM the child when the supervisor dies (even by -9).

    libc is looked up here, in the parent: between fork and exec the child only calls it.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM))

    return hook


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def env_lines(values: dict[str, str]) -> list[str]:
    """The KEY=value lines, shell-quoted only where a value needs it, in the documented order."""
    return [f"{name}={shlex.quote(values[name]) if values[name] else ''}" for name in ENV_NAMES]


def write_env_file(data_dir: Path, lines: list[str]) -> Path:
    """<data-dir>/env, mode 0600 from the first byte (it holds a key and the tick secret)."""
    path = data_dir / "env"
    tmp = data_dir / "env.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("# Written by `sftq dev`; load it into a shell with: source <this file>\n")
        f.write("\n".join(lines) + "\n")
        # Exported, so programs started from that shell (the sftq CLI, scripts) see them too.
        f.write("export " + " ".join(ENV_NAMES) + "\n")
    os.replace(tmp, path)
    return path


class DevStack:
    def __init__(
        self, config: DevConfig, *, stdout: IO[str] | None = None, stderr: IO[str] | None = None
    ) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.children: list[_Child] = []
        self.cluster: Any = None  # LocalCluster, imported lazily
        self.database_url = ""
        self.values: dict[str, str] = {}
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
            except _Interrupted:
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
            raise _Interrupted

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
        self._check_ports()
        self._prepare_data_dir()
        saved = read_env_file(self.data_dir)
        self.database_url = self._start_database(saved)
        self._check_stop()
        self._migrate()
        self._check_stop()

        from . import admin

        tick_secret = saved.get("SFTQ_TICK_SECRET") or secrets.token_urlsafe(32)
        try:
            api_key, issued = admin.ensure_user_key(
                self.database_url, DEMO_USER, saved.get("SFTQ_API_KEY")
            )
        except admin.AdminError as exc:
            raise StartupError(f"could not set up the demo user: {exc.message}") from exc
        self.log(
            f"issued a key for the demo user {DEMO_USER!r}"
            if issued
            else f"reusing the demo user's key from {self.data_dir / 'env'}"
        )

        base = f"http://{_url_host(cfg.host)}:{cfg.port}"
        sim_url = f"http://127.0.0.1:{cfg.simulator_port}" if cfg.provider == "simulator" else ""
        self.values = {
            "SUPABASE_URL": base,
            "DATABASE_URL": self.database_url,
            "SIMULATOR_URL": sim_url,
            "SFTQ_TICK_SECRET": tick_secret,
            "SFTQ_API_KEY": api_key,
            "DASHBOARD_URL": f"{base}/functions/v1/jobs-api/dashboard",
        }
        lines = env_lines(self.values)
        for line in lines:
            self.emit(line)
        path = write_env_file(self.data_dir, lines)
        self.log(f"wrote {path} (source it in another shell)")

        self._start_children()
        self._wait_ready()
        self._check_stop()
        self._start_ticker()

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
        as_root = os.geteuid() == 0
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # The folder holds a key and the tick secret. As root, the embedded PostgreSQL runs
        # as the postgres user, which must be able to pass through it (but not list it).
        os.chmod(self.data_dir, 0o711 if as_root else 0o700)
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

    def _start_database(self, saved: dict[str, str]) -> str:
        env_url = os.environ.get("DATABASE_URL", "")
        pg_dir = self.data_dir / "pg"
        # A shell that sourced our env file carries our own embedded URL in DATABASE_URL;
        # that means "the embedded database", not "someone else's server".
        ours = bool(env_url) and env_url == saved.get("DATABASE_URL") and pg_dir.is_dir()
        if env_url and not ours:
            self.log("using the database in DATABASE_URL")
            self._wait_for_database(env_url, timeout=15.0)
            return env_url
        return self._start_embedded(pg_dir)

    def _start_embedded(self, pg_dir: Path) -> str:
        from .pgcluster import ClusterError, LocalCluster, find_bindir

        try:
            bindir = find_bindir()
        except ClusterError as exc:
            raise StartupError(f"{exc}; or set DATABASE_URL to a PostgreSQL you have") from exc
        if os.geteuid() == 0:
            self._check_reachable_by_postgres(pg_dir)
        port_file = self.data_dir / "pg.port"
        port = None
        if port_file.is_file():
            with contextlib.suppress(ValueError):
                port = int(port_file.read_text(encoding="utf-8").strip())
        cluster = LocalCluster(pg_dir, port=port or DEFAULT_PG_PORT, bindir=bindir)
        # Set before starting: a start that fails half-way is still stopped on the way out.
        self.cluster = cluster
        try:
            running = cluster.running()
            if not running and not port_free("127.0.0.1", cluster.port):
                new_port = self._free_port()
                if port is not None:
                    self.log(f"port {cluster.port} saved for PostgreSQL is taken; using {new_port}")
                cluster.port = new_port
            port_file.write_text(f"{cluster.port}\n", encoding="utf-8")
            if running:
                # Left by a supervisor that was killed -9 (its children died with it; a
                # daemonized postmaster does not). Adopt it: it is stopped on the way out.
                verb = "adopting the PostgreSQL still running"
            else:
                verb = "creating PostgreSQL" if not cluster.initialized() else "starting PostgreSQL"
            self.log(f"{verb} in {pg_dir} on 127.0.0.1:{cluster.port} (binaries: {bindir})")
            cluster.start()
        except ClusterError as exc:
            raise StartupError(f"the embedded PostgreSQL did not start: {exc}") from exc
        self._check_stop()
        self._create_database(cluster.url)
        return str(cluster.url_for(DATABASE_NAME))

    @staticmethod
    def _free_port() -> int:
        from .pgcluster import free_port

        return free_port()

    def _check_reachable_by_postgres(self, pg_dir: Path) -> None:
        # PostgreSQL will not run as root, so LocalCluster runs it as `postgres`, which needs
        # search permission on every folder above its data. LocalCluster opens up folders
        # under /tmp itself; anywhere else we say what is wrong instead of failing obscurely.
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise StartupError(
                "running as root needs a `postgres` system user for the embedded "
                "PostgreSQL; create one, run as another user, or set DATABASE_URL"
            ) from exc
        for parent in pg_dir.resolve().parents:
            if str(parent).startswith(("/tmp", "/var/tmp")):
                continue
            st = parent.stat()
            searchable = (
                st.st_mode & 0o001
                or (st.st_uid == pw.pw_uid and st.st_mode & 0o100)
                or (st.st_gid == pw.pw_gid and st.st_mode & 0o010)
            )
            if not searchable:
                raise StartupError(
                    f"as root the embedded PostgreSQL runs as the postgres user, which cannot "
                    f"enter {parent}; give it search permission (chmod o+x {parent}), choose a "
                    f"--data-dir it can reach, or set DATABASE_URL"
                )

    def _create_database(self, admin_url: str) -> None:
        import psycopg
        from psycopg import sql

        try:
            with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
                row = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
                ).fetchone()
                if row is None:
                    conn.execute(
                        sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME))
                    )
        except psycopg.Error as exc:
            raise StartupError(f"could not create the {DATABASE_NAME} database: {exc}") from exc

    def _wait_for_database(self, url: str, timeout: float) -> None:
        from .admin import redact

        deadline = time.monotonic() + timeout
        while True:
            error = self._database_error(url)
            if error is None:
                return
            if time.monotonic() > deadline:
                raise StartupError(f"cannot reach the database at {redact(url)}: {error}")
            self._check_stop()
            time.sleep(0.5)

    @staticmethod
    def _database_error(url: str) -> str | None:
        import psycopg

        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            return str(exc).strip() or type(exc).__name__
        return None

    def _migrate(self) -> None:
        from . import migrate

        try:
            done = migrate.migrate(self.database_url)
        except migrate.MigrationError as exc:
            raise StartupError(str(exc)) from exc
        except Exception as exc:  # psycopg errors: connection lost, permissions
            raise StartupError(f"migrations failed: {exc}") from exc
        self.log(f"migrations: {len(done)} file(s) applied" if done else "migrations: up to date")

    # -- children --------------------------------------------------------------------
    def _start_children(self) -> None:
        cfg = self.config
        base_env = os.environ | {"PYTHONUNBUFFERED": "1"}
        gateway_env = base_env | {
            "DATABASE_URL": self.database_url,
            "SFTQ_TICK_SECRET": self.values["SFTQ_TICK_SECRET"],
        }
        gateway_env |= {"SFTQ_TICK_INTERVAL_SECONDS": f"{cfg.tick_interval:g}"} if cfg.tick_interval > 0 else {}  # noqa: E501
        if cfg.provider == "simulator":
            self._spawn(
                "simulator",
                [
                    sys.executable,
                    "-m",
                    "sftq_server.simulator",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(cfg.simulator_port),
                    "--job-seconds",
                    f"{cfg.simulator_job_seconds:g}",
                    "--account-id",
                    SIMULATOR_ACCOUNT,
                ],
                base_env,
            )
            gateway_env |= {
                "FIREWORKS_BASE_URL": self.values["SIMULATOR_URL"],
                "FIREWORKS_API_KEY": SIMULATOR_API_KEY,
                "FIREWORKS_ACCOUNT_ID": SIMULATOR_ACCOUNT,
            }
        self._check_stop()
        self._spawn(
            "gateway",
            server_command("serve", "--host", cfg.host, "--port", str(cfg.port)),
            gateway_env,
        )

    def _start_ticker(self) -> None:
        # Started once the gateway answers: its first tick fires at once and should land.
        cfg = self.config
        if cfg.tick_interval <= 0:
            self.log("ticker off (--tick-interval 0): tick with POST /functions/v1/scheduler-tick")
            return
        env = os.environ | {
            "PYTHONUNBUFFERED": "1",
            "SFTQ_TICK_SECRET": self.values["SFTQ_TICK_SECRET"],
        }
        self._spawn(
            "ticker",
            server_command(
                "ticker",
                "--interval",
                f"{cfg.tick_interval:g}",
                "--url",
                self._tick_url(),
                "--data-dir",
                str(self.data_dir),
            ),
            env,
        )

    def _local_base(self) -> str:
        return f"http://{_url_host(_probe_host(self.config.host))}:{self.config.port}"

    def _tick_url(self) -> str:
        return f"{self._local_base()}/functions/v1/scheduler-tick"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> _Child:
        # Children write to our stderr: stdout stays the machine-readable channel.
        try:
            out = self.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            out = 2
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            env=env,
            start_new_session=True,
            preexec_fn=_death_signal_hook(),
        )
        child = _Child(name, proc, argv)
        self.children.append(child)
        self.log(f"started {name} (pid {proc.pid})")
        return child

    def _wait_ready(self) -> None:
        cfg = self.config
        checks: dict[str, Callable[[], bool]] = {
            "database": lambda: self._database_error(self.database_url) is None,
            "gateway": lambda: _http_ok(f"{self._local_base()}/functions/v1/jobs-api/health"),
        }
        if cfg.provider == "simulator":
            checks["simulator"] = lambda: _http_ok(f"{self.values['SIMULATOR_URL']}/_sim/health")
        deadline = time.monotonic() + cfg.ready_timeout
        while checks:
            self._check_stop()
            dead = self._dead_child()
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

    def _dead_child(self) -> _Child | None:
        for child in self.children:
            if child.proc.poll() is not None:
                return child
        return None

    def _postmaster_pid(self) -> int | None:
        if self.cluster is None:
            return None
        try:
            first = (self.cluster.pgdata / "postmaster.pid").read_text().splitlines()[0]
            return int(first)
        except (OSError, ValueError, IndexError):
            return None

    # -- running ---------------------------------------------------------------------
    def _supervise(self) -> int:
        next_db_check = time.monotonic() + 2.0
        while not self._stop.wait(0.25):
            dead = self._dead_child()
            if dead is not None:
                self.log(
                    f"error: the {dead.name} (pid {dead.proc.pid}) exited unexpectedly with "
                    f"code {dead.proc.returncode}; stopping everything"
                )
                return EXIT_FAILED
            if self.cluster is not None and time.monotonic() > next_db_check:
                next_db_check = time.monotonic() + 2.0
                pid = self._postmaster_pid()
                if pid is None or not _pid_alive(pid):
                    self.log(
                        "error: the embedded PostgreSQL stopped unexpectedly; stopping everything"
                    )
                    return EXIT_FAILED
        self.log(f"{self._stop_reason or 'stop requested'}: stopping")
        return EXIT_OK

    # -- stopping --------------------------------------------------------------------
    def _shutdown(self) -> None:
        # Newest first: the ticker stops calling the gateway, the gateway stops calling the
        # simulator. All are signalled at once and share one deadline, so stopping is quick.
        children = list(reversed(self.children))
        for child in children:
            if child.proc.poll() is None:
                _signal_group(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.stop_timeout
        for child in children:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log(
                    f"the {child.name} did not stop in {self.config.stop_timeout:g}s; killing it"
                )
                _signal_group(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
            # The leader is gone; anything it left in its group goes too.
            if _group_alive(child.proc.pid):
                _signal_group(child.proc.pid, signal.SIGKILL)
        if children:
            self.log("stopped " + ", ".join(c.name for c in children))
        self.children.clear()
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            from .pgcluster import ClusterError

            try:
                cluster.stop()
                self.log("stopped PostgreSQL")
            except ClusterError as exc:
                self.log(f"PostgreSQL did not stop cleanly ({exc}); stopping it immediately")
                with contextlib.suppress(ClusterError):
                    cluster.stop("immediate")
