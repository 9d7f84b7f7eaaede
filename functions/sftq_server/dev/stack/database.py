"""The dev stack's database: the one in DATABASE_URL, or an embedded PostgreSQL kept in
<data-dir>/pg (through LocalCluster), started or adopted, given its database, and migrated.

The embedded cluster's port is kept in <data-dir>/pg.port, so DATABASE_URL stays the same from
one start to the next.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sftq_server.dev.stack.common import StartupError, pid_alive, port_free

DEFAULT_PG_PORT = 54329
DATABASE_NAME = "sftq"
# As root, embedded clusters live here (see DevDatabase._cluster_folder).
STATE_ROOT = Path("/var/lib/sftq/dev")


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
        ours = bool(env_url) and env_url == saved.get("DATABASE_URL") and pg_dir.exists()
        if env_url and not ours:
            self.log("using the database in DATABASE_URL")
            self._wait_for(env_url, timeout=15.0)
            self.url = env_url
        else:
            self.url = self._start_embedded(pg_dir, saved)
        return self.url

    def _start_embedded(self, pg_dir: Path, saved: dict[str, str]) -> str:
        from sftq_server.dev.pgcluster import ClusterError, LocalCluster, find_bindir, free_port

        try:
            bindir = find_bindir()
        except ClusterError as exc:
            raise StartupError(f"{exc}; or set DATABASE_URL to a PostgreSQL you have") from exc
        port_file = self.data_dir / "pg.port"
        port = None
        if port_file.is_file():
            with contextlib.suppress(ValueError):
                port = int(port_file.read_text(encoding="utf-8").strip())
        try:
            folder = self._cluster_folder(pg_dir)
            cluster = LocalCluster(
                folder,
                port=port or DEFAULT_PG_PORT,
                bindir=bindir,
                password=_saved_password(saved) or secrets.token_hex(24),
            )
            # Set before starting: a start that fails half-way is still stopped on the way out.
            self.cluster = cluster
            runnable = cluster.runnable_bindir()
            if runnable != bindir:
                self.log(
                    f"the postgres user cannot run the binaries in {bindir}; using a copy "
                    f"in {runnable}"
                )
            # A server killed a moment ago (kill -9, OOM) may still be on its way out: wait
            # for it to go rather than adopt what will not answer.
            running = cluster.settle() == "running"
            if not running:
                # initdb first: it takes seconds, in which another stack starting next to this
                # one may take the port; checking after it leaves a window of milliseconds.
                cluster.init()
            if not running and not port_free("127.0.0.1", cluster.port):
                new_port = free_port()
                if port is not None:
                    self.log(f"port {cluster.port} saved for PostgreSQL is taken; using {new_port}")
                cluster.port = new_port
            if running:
                # Left by a supervisor that was killed -9 (its children died with it; a
                # daemonized postmaster does not). Adopt it: it is stopped on the way out.
                verb = "adopting the PostgreSQL still running"
            else:
                verb = "creating PostgreSQL" if not cluster.initialized() else "starting PostgreSQL"
            where = pg_dir if folder == pg_dir else f"{pg_dir} (-> {folder})"
            self.log(f"{verb} in {where} on 127.0.0.1:{cluster.port} (binaries: {bindir})")
            self._start_on_a_free_port(cluster, adopted=running)
            # Kept for the next start: DATABASE_URL stays the same for this data dir.
            port_file.write_text(f"{cluster.port}\n", encoding="utf-8")
        except ClusterError as exc:
            raise StartupError(
                f"the embedded PostgreSQL did not start: {exc}. Its port is kept in {port_file}: "
                "write a free port there to choose it, or set DATABASE_URL to a PostgreSQL you "
                "have"
            ) from exc
        self.check_stop()
        self._create_database(cluster.socket_conninfo())
        return str(cluster.url_for(DATABASE_NAME))

    def _start_on_a_free_port(self, cluster: Any, adopted: bool, attempts: int = 3) -> None:
        """Start the cluster; when its port was taken meanwhile (two stacks starting at once
        both found it free), on another free one."""
        from sftq_server.dev.pgcluster import ClusterError, free_port

        for attempt in range(1, attempts + 1):
            try:
                cluster.start()
                return
            except ClusterError:
                if adopted or attempt == attempts or port_free("127.0.0.1", cluster.port):
                    raise  # not a port taken by someone else
                new_port = free_port()
                self.log(f"port {cluster.port} was taken while PostgreSQL started; using "
                         f"{new_port}")
                cluster.port = new_port

    def _cluster_folder(self, pg_dir: Path) -> Path:
        """Where the cluster's files live: <data-dir>/pg, or as root a folder of the postgres
        user's under STATE_ROOT that <data-dir>/pg links to.

        As root the server runs as `postgres`, which must be able to enter every folder above
        its files. A data dir inside a private home folder (/root, 0700) is out of its reach,
        and the data dir itself stays 0700; so the cluster lives where that user can go.
        """
        if os.geteuid() != 0:
            return pg_dir
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError as exc:
            raise StartupError(
                "running as root needs a `postgres` system user for the embedded "
                "PostgreSQL; create one, run as another user, or set DATABASE_URL"
            ) from exc
        if pg_dir.is_symlink():
            return pg_dir.resolve()  # made by an earlier start, maybe for a folder since moved
        slug = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        home = STATE_ROOT / f"{self.data_dir.parent.name or 'root'}-{slug}"
        for folder in (STATE_ROOT.parent, STATE_ROOT):
            folder.mkdir(exist_ok=True)
            os.chmod(folder, 0o711)  # postgres passes through; no one lists the projects
        if pg_dir.is_dir():
            self._move_cluster(pg_dir, home)
        elif home.exists():
            # Left by a data dir of the same path that was deleted (`rm -rf .sftq`, make clean):
            # starting over is what deleting it asked for.
            self.log(f"removing the PostgreSQL left in {home} by an earlier {self.data_dir}")
            self._remove_cluster(home)
        pg_dir.symlink_to(home, target_is_directory=True)
        return home

    def _move_cluster(self, pg_dir: Path, home: Path) -> None:
        """A cluster made inside the data dir (before it became 0700) moves out, stopped."""
        import pwd

        from sftq_server.dev.pgcluster import LocalCluster

        self.log(
            f"moving the embedded PostgreSQL from {pg_dir} to {home} (the postgres user "
            f"cannot enter {self.data_dir})"
        )
        old = LocalCluster(pg_dir, port=1)
        pid = old.postmaster_pid()
        if pid is not None and old.running():
            # Still running (left by a supervisor killed -9): stop it cleanly first. It needs to
            # reach its files while it shuts down, through the data dir, which is 0700 now:
            # let postgres pass for that long. Root asks the postmaster directly (SIGINT is a
            # fast shutdown); pg_ctl would run as postgres.
            os.chmod(self.data_dir, 0o711)
            try:
                os.kill(pid, signal.SIGINT)
                deadline = time.monotonic() + 30
                while old.running():
                    if time.monotonic() > deadline:
                        raise StartupError(f"the PostgreSQL in {pg_dir} (pid {pid}) did not stop")
                    time.sleep(0.2)
            finally:
                os.chmod(self.data_dir, 0o700)
        if home.exists():
            self._remove_cluster(home)
        try:
            os.rename(pg_dir, home)
        except OSError:
            shutil.copytree(pg_dir, home, symlinks=True)
            pw = pwd.getpwnam("postgres")
            for root, dirs, files in os.walk(home):
                for name in (".", *dirs, *files):
                    os.lchown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)
            shutil.rmtree(pg_dir)

    @staticmethod
    def _remove_cluster(folder: Path) -> None:
        from sftq_server.dev.pgcluster import LocalCluster

        cluster = LocalCluster(folder, port=1)
        if cluster.running():
            cluster.stop("immediate")
        shutil.rmtree(folder)

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
        from sftq_server.dev.admin import redact

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
        from sftq_server.db import migrate as migrate

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
        from sftq_server.dev.pgcluster import ClusterError

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


def _saved_password(saved: dict[str, str]) -> str | None:
    """The embedded superuser's password, from the DATABASE_URL of the env file we wrote."""
    from urllib.parse import urlsplit

    url = urlsplit(saved.get("DATABASE_URL", ""))
    if url.hostname == "127.0.0.1" and url.username == "postgres" and url.password:
        return url.password
    return None
