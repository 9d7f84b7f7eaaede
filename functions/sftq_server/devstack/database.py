"""The dev stack's database: the one in DATABASE_URL, or an embedded PostgreSQL kept in
<data-dir>/pg (through LocalCluster), started or adopted, given its database, and migrated.

The embedded cluster's port is kept in <data-dir>/pg.port, so DATABASE_URL stays the same from
one start to the next.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import StartupError, pid_alive, port_free

DEFAULT_PG_PORT = 54329
DATABASE_NAME = "sftq"


class DevDatabase:
    def __init__(
        self, data_dir: Path, log: Callable[[str], None], check_stop: Callable[[], None]
    ) -> None:
        self.data_dir = data_dir
        self.log = log
        self.check_stop = check_stop
        self.cluster: Any = None  # LocalCluster, imported lazily
        self.url = ""

    # -- starting --------------------------------------------------------------------
    def start(self, saved: dict[str, str]) -> str:
        """The database URL, once it answers: DATABASE_URL, else the embedded cluster."""
        env_url = os.environ.get("DATABASE_URL", "")
        pg_dir = self.data_dir / "pg"
        # A shell that sourced our env file carries our own embedded URL in DATABASE_URL;
        # that means "the embedded database", not "someone else's server".
        ours = bool(env_url) and env_url == saved.get("DATABASE_URL") and pg_dir.is_dir()
        if env_url and not ours:
            self.log("using the database in DATABASE_URL")
            self._wait_for(env_url, timeout=15.0)
            self.url = env_url
        else:
            self.url = self._start_embedded(pg_dir)
        return self.url

    def _start_embedded(self, pg_dir: Path) -> str:
        from ..pgcluster import ClusterError, LocalCluster, find_bindir

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
                from ..pgcluster import free_port

                new_port = free_port()
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
        self.check_stop()
        self._create_database(cluster.url)
        return str(cluster.url_for(DATABASE_NAME))

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

    def _wait_for(self, url: str, timeout: float) -> None:
        from ..admin import redact

        deadline = time.monotonic() + timeout
        while True:
            error = database_error(url)
            if error is None:
                return
            if time.monotonic() > deadline:
                raise StartupError(f"cannot reach the database at {redact(url)}: {error}")
            self.check_stop()
            time.sleep(0.5)

    def migrate(self) -> None:
        from .. import migrate

        try:
            done = migrate.migrate(self.url)
        except migrate.MigrationError as exc:
            raise StartupError(str(exc)) from exc
        except Exception as exc:  # psycopg errors: connection lost, permissions
            raise StartupError(f"migrations failed: {exc}") from exc
        self.log(f"migrations: {len(done)} file(s) applied" if done else "migrations: up to date")

    # -- running ---------------------------------------------------------------------
    def answers(self) -> bool:
        return database_error(self.url) is None

    def embedded_stopped(self) -> bool:
        """True when the embedded PostgreSQL has gone away (never for DATABASE_URL)."""
        if self.cluster is None:
            return False
        pid = self._postmaster_pid()
        return pid is None or not pid_alive(pid)

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.cluster.pgdata / "postmaster.pid").read_text().splitlines()[0]
            return int(first)
        except (OSError, ValueError, IndexError):
            return None

    # -- stopping --------------------------------------------------------------------
    def stop(self) -> None:
        if self.cluster is None:
            return
        cluster, self.cluster = self.cluster, None
        from ..pgcluster import ClusterError

        try:
            cluster.stop()
            self.log("stopped PostgreSQL")
        except ClusterError as exc:
            self.log(f"PostgreSQL did not stop cleanly ({exc}); stopping it immediately")
            with contextlib.suppress(ClusterError):
                cluster.stop("immediate")


def database_error(url: str) -> str | None:
    """Why a query on url fails, or None when the database answers."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return str(exc).strip() or type(exc).__name__
    return None
