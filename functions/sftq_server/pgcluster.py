"""A private PostgreSQL cluster on loopback, for tests and for `sftq dev`.

Uses the machine's PostgreSQL binaries when there are any, else the ones bundled in the
pip package `pgserver`. PostgreSQL refuses to run as root, so as root the cluster runs
as the `postgres` user (through runuser) in a folder that user owns.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path


class ClusterError(Exception):
    pass


def find_bindir() -> Path:
    """PostgreSQL server binaries: $SFTQ_PG_BINDIR, pg_config, Debian's layout, or pgserver."""
    env = os.environ.get("SFTQ_PG_BINDIR")
    if env:
        return Path(env)
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if (candidate / "pg_ctl").exists():
            return candidate
    for found in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(found, "pg_ctl").exists():
            return Path(found)
    try:
        import pgserver
    except ImportError as exc:
        raise ClusterError(
            "no PostgreSQL server binaries found: install PostgreSQL, or `pip install pgserver`"
        ) from exc
    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _as_root() -> bool:
    return os.geteuid() == 0


class LocalCluster:
    def __init__(
        self,
        data_dir: str | Path,
        port: int | None = None,
        *,
        bindir: Path | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.bindir = bindir or find_bindir()
        self.settings = settings or {}
        self.user = "postgres"
        self.socket_dir = self.data_dir / "sockets"

    # -- running commands as the cluster's owner ------------------------------------
    def _cmd(self, *args: str) -> list[str]:
        if _as_root():
            return ["runuser", "-u", "postgres", "--", *args]
        return list(args)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = os.environ | {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        proc = subprocess.run(
            self._cmd(*args), capture_output=True, text=True, env=env, check=False
        )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"{' '.join(args[:2])} failed: {proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc

    def _chown(self, path: Path) -> None:
        if _as_root():
            pw = pwd.getpwnam("postgres")
            os.chown(path, pw.pw_uid, pw.pw_gid)

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def init(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        for path in (self.data_dir, self.socket_dir):
            self._chown(path)
        if _as_root():
            # The postgres user must be able to reach its folder.
            for parent in self.data_dir.parents:
                mode = parent.stat().st_mode
                if not mode & 0o001 and str(parent).startswith(("/tmp", "/var/tmp")):
                    os.chmod(parent, mode | 0o001)
        if self.initialized():
            return
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.pgdata),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-instructions",
        )

    def running(self) -> bool:
        proc = self._run(str(self.bindir / "pg_ctl"), "status", "-D", str(self.pgdata), check=False)
        return proc.returncode == 0

    def start(self, timeout: float = 60.0) -> None:
        if not self.initialized():
            self.init()
        if self.running():
            return
        opts = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.socket_dir}'",
            **self.settings,
        }
        o = " ".join(f"-c {k}={v}" for k, v in opts.items())
        log = self.data_dir / "postgres.log"
        if not log.exists():
            log.touch()
            self._chown(log)
        self._run(
            str(self.bindir / "pg_ctl"),
            "start",
            "-w",
            "-t",
            str(int(timeout)),
            "-D",
            str(self.pgdata),
            "-l",
            str(log),
            "-o",
            o,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise ClusterError(f"PostgreSQL did not start; see {log}")

    def stop(self, mode: str = "fast") -> None:
        if self.initialized() and self.running():
            self._run(str(self.bindir / "pg_ctl"), "stop", "-D", str(self.pgdata), "-m", mode, "-w")

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.data_dir, ignore_errors=True)
