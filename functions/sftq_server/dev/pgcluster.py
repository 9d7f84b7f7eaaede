"""A private PostgreSQL cluster on loopback, for tests and for `sftq dev`.

Uses the machine's PostgreSQL binaries when there are any, else the ones bundled in the
pip package `pgserver`. PostgreSQL refuses to run as root, so as root the cluster runs
as the `postgres` user (through runuser) in a folder that user owns; binaries that user
cannot run where they are (a virtualenv in a private home folder) are copied once, with the
libraries they load, to a cache it can read (runnable_bindir; /var/cache/sftq, or
$SFTQ_CACHE_DIR).

The folder holds the data (pgdata, made 0700 by initdb), the Unix socket in a 0700 folder of
its own, and the server log (0600). With a password the cluster is reachable over TCP only
with it (scram-sha-256); its socket stays trust, which only the cluster's owner (and root)
can use, since no one else may enter the socket's folder.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import pwd
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Literal

# Where copies of server binaries live when the postgres user cannot run them in place
# (SFTQ_CACHE_DIR, when set, instead).
BINARY_CACHE = Path("/var/cache/sftq")
# Part of a copy's name: a copy made by a version of this module that laid copies out
# differently (one that left the libraries behind) is never taken for a good one.
_COPY_LAYOUT = b"sftq-postgres-copy-2"
# The binaries a cluster runs; each must be runnable by the cluster's owner.
_SERVER_TOOLS = ("initdb", "pg_ctl", "postgres")
# Libraries found here are the system's and stay where they are; others travel with a copy.
_SYSTEM_LIB_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", "/usr/local/lib/")
# Folders that hold far more than PostgreSQL (binaries in /usr/bin): never copied whole.
_SYSTEM_PREFIXES = ("/", "/usr", "/usr/local", "/opt")
# What initdb reads from an installation's share folder, wherever its build put it.
_CATALOG_FILES = (
    "share/postgres.bki",
    "share/postgresql/postgres.bki",
    "share/postgresql/*/postgres.bki",
)
# The SSLRequest packet: any PostgreSQL answers it with one byte, before authentication.
_SSL_REQUEST = struct.pack("!ii", 8, 80877103)

State = Literal["stopped", "running", "stale", "unresponsive"]


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


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on now, never one this process handed out before: the
    kernel may give the same free port to two binds in a row, and a caller that asks twice (an
    API and a simulator port) must get two different ports."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def _as_root() -> bool:
    return os.geteuid() == 0


def _env() -> dict[str, str]:
    return os.environ | {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}


# -- binaries the postgres user can run ------------------------------------------------
def _run_error(bindir: Path, user: str) -> str | None:
    """Why `user` cannot run the server binaries in bindir (None: it can)."""
    for tool in _SERVER_TOOLS:
        # --version loads the binary and its libraries: the whole path the server needs.
        proc = subprocess.run(
            ["runuser", "-u", user, "--", str(bindir / tool), "--version"],
            capture_output=True,
            text=True,
            env=_env(),
            check=False,
            cwd="/",
        )
        if proc.returncode != 0:
            return f"{tool}: {(proc.stderr or proc.stdout).strip() or f'exit {proc.returncode}'}"
    return None


def _elf_search_dirs(path: Path) -> list[str]:
    """The RPATH and RUNPATH entries of an ELF file as written ($ORIGIN unexpanded); [] for a
    file that is not ELF or has none. Read here rather than through ldd or readelf, which a
    machine (or a PATH) may not have: without them a copy left its libraries behind."""
    try:
        with path.open("rb") as f:
            data = f.read()
    except OSError:
        return []
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return []
    wide, end = data[4] == 2, "<" if data[5] == 1 else ">"
    try:
        if wide:
            (phoff,) = struct.unpack_from(end + "Q", data, 0x20)
            phentsize, phnum = struct.unpack_from(end + "HH", data, 0x36)
        else:
            (phoff,) = struct.unpack_from(end + "I", data, 0x1C)
            phentsize, phnum = struct.unpack_from(end + "HH", data, 0x2A)
        loads: list[tuple[int, int, int]] = []  # (vaddr, offset, size in the file)
        dynamic: tuple[int, int] | None = None  # (offset, size)
        for i in range(phnum):
            at = phoff + i * phentsize
            if wide:
                p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
                    end + "IIQQQQ", data, at
                )
            else:
                p_type, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(end + "IIIII", data, at)
            if p_type == 1:  # PT_LOAD
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:  # PT_DYNAMIC
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return []
        entry = struct.Struct(end + ("qQ" if wide else "iI"))
        strtab, paths = None, []
        for at in range(dynamic[0], dynamic[0] + dynamic[1] - entry.size + 1, entry.size):
            tag, value = entry.unpack_from(data, at)
            if tag == 0:  # DT_NULL
                break
            if tag == 5:  # DT_STRTAB (an address)
                strtab = value
            elif tag in (15, 29):  # DT_RPATH, DT_RUNPATH (offsets into the string table)
                paths.append(value)
        if strtab is None:
            return []
        base = next(
            (off + strtab - va for va, off, size in loads if va <= strtab < va + size), None
        )
        if base is None:
            return []
        found: list[str] = []
        for offset in paths:
            start = base + offset
            text = data[start : data.index(b"\0", start)].decode("utf-8", "replace")
            found.extend(item for item in text.split(":") if item)
        return found
    except (struct.error, ValueError):
        return []


def _elf_files(folder: Path) -> list[Path]:
    return sorted(
        p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and p.suffix != ".a"
    )


def _private_library_dirs(prefix: Path) -> set[Path]:
    """Folders outside the installation `prefix` that its binaries and libraries (the server's
    modules too, which it loads when it needs them) find libraries in through an
    $ORIGIN-relative RPATH or RUNPATH: pgserver's `pgserver.libs` beside the package, from
    `$ORIGIN/../../../pgserver.libs`. A copy of the installation must bring them along, at
    the same place relative to it. An absolute RPATH names the same folder from the copy as
    from the original, so it does not travel."""
    found: set[Path] = set()
    todo = [prefix / "bin", prefix / "lib"]
    seen: set[Path] = set()
    while todo:
        folder = todo.pop()
        if folder in seen or not folder.is_dir():
            continue
        seen.add(folder)
        for path in _elf_files(folder):
            for entry in _elf_search_dirs(path):
                if not entry.startswith(("$ORIGIN", "${ORIGIN}")):
                    continue
                origin = str(path.resolve().parent)
                where = Path(entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin))
                try:
                    where = where.resolve(strict=True)
                except OSError:
                    continue
                if (
                    where.is_dir()
                    and where != prefix
                    and prefix not in where.parents
                    and where not in prefix.parents  # never a folder holding the installation
                    and not str(where).startswith(_SYSTEM_LIB_DIRS)
                    and where not in found
                ):
                    found.add(where)
                    todo.append(where)  # its libraries may name folders of their own
    return found


def installation_root(bindir: Path) -> Path:
    """The PostgreSQL installation the server binaries in bindir belong to: the folder holding
    the real bin/ (symlinks resolved, so a ~/bin of links names the installation it points
    into, not ~) and share/. ClusterError, naming SFTQ_PG_BINDIR, when that is not one
    self-contained installation: copying it would copy the wrong tree, or a broken one."""

    def refuse(why: str) -> ClusterError:
        return ClusterError(
            f"the PostgreSQL binaries in {bindir} (SFTQ_PG_BINDIR, or found on this machine) "
            f"cannot be copied for the postgres user: {why}. Set SFTQ_PG_BINDIR to the bin/ "
            "folder of a PostgreSQL installation (bin/, lib/, share/ with postgres.bki), or to "
            "binaries the postgres user can run where they are"
        )

    real_dirs = set()
    for tool in _SERVER_TOOLS:
        try:
            real_dirs.add((bindir / tool).resolve(strict=True).parent)
        except OSError:
            raise refuse(f"{bindir / tool} does not exist") from None
    if len(real_dirs) != 1:
        folders = ", ".join(str(d) for d in sorted(real_dirs))
        raise refuse(f"{', '.join(_SERVER_TOOLS)} lead to different folders ({folders})")
    (real_bindir,) = real_dirs
    root = real_bindir.parent
    if real_bindir.name != "bin":
        raise refuse(f"{bindir / 'postgres'} is in {real_bindir}, which is not a bin/ folder")
    if str(root) in _SYSTEM_PREFIXES:
        raise refuse(f"{real_bindir} is the system's own; {root} is not copied")
    if not any(glob.glob(os.path.join(glob.escape(str(root)), p)) for p in _CATALOG_FILES):
        raise refuse(f"{root} has no share/ folder with postgres.bki beside {real_bindir}")
    return root


def _copy_sources(bindir: Path) -> tuple[Path, list[Path]]:
    """What a copy of bindir's installation holds: the common folder of it all (the anchor),
    and the folders copied under it: the installation, and private libraries outside it."""
    prefix = installation_root(bindir)  # bin, lib, share
    libs = _private_library_dirs(prefix)
    anchor = Path(os.path.commonpath([prefix, *libs]))
    return anchor, [prefix, *sorted(libs)]


def binary_cache() -> Path:
    """Where copies of server binaries go: $SFTQ_CACHE_DIR, else /var/cache/sftq."""
    return Path(os.environ.get("SFTQ_CACHE_DIR") or BINARY_CACHE)


def _copy_for_postgres(bindir: Path, cache: Path, *, replace: bool = False) -> Path:
    """A copy of the installation around bindir under `cache`, readable by everyone; the
    copied bindir. The installation (bin, lib, share) with the library folders its binaries
    find through $ORIGIN (_private_library_dirs), keyed by their content, made once:
    atomically (a copy in progress is never used, and of two made at once one wins).
    replace: the copy under that key is broken; make it again."""
    anchor, sources = _copy_sources(bindir)
    prefix, libs = sources[0], sources[1:]
    digest = hashlib.sha256(_COPY_LAYOUT)
    for path in sorted([*(bindir / t for t in _SERVER_TOOLS), *libs]):
        if path.is_file():
            digest.update(path.read_bytes())
        else:
            digest.update(str(path.relative_to(anchor)).encode())
            for item in sorted(p for p in path.iterdir() if p.is_file()):
                digest.update(item.name.encode() + item.read_bytes())
    target = cache / f"postgres-{digest.hexdigest()[:16]}"
    copied_bindir = target / (bindir / "postgres").resolve().parent.relative_to(anchor)
    if replace and target.exists():
        # Moved aside in one step, so no start ever sees half of it; a start that moved
        # it first does the same, and one of the two fresh copies below wins.
        aside = cache / f".{target.name}.stale.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            target.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)
    if (target / ".complete").exists():
        return copied_bindir
    cache.mkdir(parents=True, exist_ok=True)
    os.chmod(cache, 0o755)
    staging = cache / f".{target.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for source in sources:
            shutil.copytree(
                source,
                staging / source.relative_to(anchor),
                symlinks=True,
                ignore=shutil.ignore_patterns("include") if source == prefix else None,
            )
        for root, _dirs, files in os.walk(staging):
            os.chmod(root, 0o755)
            for name in files:
                path = Path(root, name)
                if not path.is_symlink():
                    executable = path.stat().st_mode & 0o111
                    os.chmod(path, 0o755 if executable else 0o644)
        (staging / ".complete").touch()
        try:
            staging.rename(target)
        except OSError:
            # Another process made the same copy first; theirs is as good as ours.
            if not (target / ".complete").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return copied_bindir


def runnable_bindir(bindir: Path, user: str = "postgres", cache: Path | None = None) -> Path:
    """bindir when `user` can run its server binaries, else a copy of them it can run.

    Only matters as root (the server then runs as `user`): binaries inside a folder only root
    may enter, such as a virtualenv under /root, are copied once to `cache` (binary_cache()).
    A copy there that does not run (made by hand, or by an older version) is made again.
    """
    if not _as_root() or _run_error(bindir, user) is None:
        return bindir
    cache = cache or binary_cache()
    error = None
    for replace in (False, True):
        try:
            copied = _copy_for_postgres(bindir, cache, replace=replace)
        except OSError as exc:
            raise ClusterError(
                f"the {user} user cannot run the PostgreSQL binaries in {bindir}, and copying "
                f"them to {cache} failed: {exc}"
            ) from exc
        error = _run_error(copied, user)
        if error is None:
            return copied
    raise ClusterError(
        f"the {user} user cannot run the PostgreSQL binaries in {bindir}, nor their copy "
        f"in {copied} ({error})"
    )


# -- processes -------------------------------------------------------------------------
def _process_running(pid: int) -> bool:
    """The process exists and has not exited (a zombie that no one has reaped yet has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return signal_possible(pid)
    return stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X")


def signal_possible(pid: int) -> bool:
    """What PostgreSQL itself asks of the pid in a lock file: can it be signalled (kill 0)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _shared_memory_attached(shmid: int) -> int:
    """How many processes still have the System V segment `shmid` attached (0: none, or gone)."""
    try:
        lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    except OSError:
        return 0
    header = lines[0].split() if lines else []
    if "shmid" not in header or "nattch" not in header:
        return 0
    id_col, n_col = header.index("shmid"), header.index("nattch")
    for line in lines[1:]:
        fields = line.split()
        if len(fields) > max(id_col, n_col) and fields[id_col] == str(shmid):
            return int(fields[n_col])
    return 0


class LocalCluster:
    def __init__(
        self,
        data_dir: str | Path,
        port: int | None = None,
        *,
        bindir: Path | None = None,
        settings: dict[str, str] | None = None,
        password: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.bindir = bindir or find_bindir()
        self.settings = settings or {}
        self.password = password
        self.user = "postgres"
        self.socket_dir = self.data_dir / "sockets"
        self._runnable: Path | None = None

    # -- running commands as the cluster's owner ------------------------------------
    def _cmd(self, *args: str) -> list[str]:
        if _as_root():
            return ["runuser", "-u", "postgres", "--", *args]
        return list(args)

    def _tool(self, name: str) -> str:
        return str(self.runnable_bindir() / name)

    def runnable_bindir(self) -> Path:
        """The binaries as the cluster's owner runs them: bindir, or a copy (runnable_bindir)."""
        if self._runnable is None:
            self._runnable = runnable_bindir(self.bindir, self.user)
        return self._runnable

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        # From "/": as root the tools run as postgres, which may not enter the folder `sftq dev`
        # was started from (a checkout in /root), and pg_ctl refuses to start without its cwd.
        proc = subprocess.run(
            self._cmd(*args), capture_output=True, text=True, env=_env(), check=False, cwd="/"
        )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"{' '.join(Path(a).name if i == 0 else a for i, a in enumerate(args[:2]))} "
                f"failed: {proc.stderr.strip() or proc.stdout.strip()}"
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
    def log_path(self) -> Path:
        return self.data_dir / "postgres.log"

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        """A TCP URL on loopback (with the password, when the cluster has one)."""
        auth = f"postgres:{self.password}" if self.password else "postgres"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def socket_conninfo(self, dbname: str = "postgres") -> str:
        """A connection string through the cluster's own Unix socket (its owner and root only)."""
        from psycopg.conninfo import make_conninfo

        return make_conninfo(
            host=str(self.socket_dir), port=str(self.port), user="postgres", dbname=dbname
        )

    def initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def init(self) -> None:
        self._prepare_folders()
        if self.initialized():
            return
        auth = (
            ["--auth-local=trust", "--auth-host=scram-sha-256"]
            if self.password
            else ["--auth=trust"]
        )
        self._run(
            self._tool("initdb"),
            "-D",
            str(self.pgdata),
            "-U",
            "postgres",
            *auth,
            "--encoding=UTF8",
            "--no-instructions",
        )

    def _prepare_folders(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        for path in (self.data_dir, self.socket_dir):
            # Only the owner: the socket folder is what keeps other local users off the
            # socket's trust login, and the folder holds the server log.
            os.chmod(path, 0o700)
            self._chown(path)
        if _as_root():
            # The postgres user must be able to reach its folder.
            for parent in self.data_dir.parents:
                mode = parent.stat().st_mode
                if not mode & 0o001 and str(parent).startswith(("/tmp", "/var/tmp")):
                    os.chmod(parent, mode | 0o001)
        log = self.log_path
        if not log.exists():
            os.close(os.open(log, os.O_WRONLY | os.O_CREAT, 0o600))
        # The log can hold statements and connection details: the owner's alone.
        os.chmod(log, 0o600)
        self._chown(log)

    # -- is it running? --------------------------------------------------------------
    def _pid_file(self) -> list[str]:
        try:
            return (self.pgdata / "postmaster.pid").read_text().splitlines()
        except OSError:
            return []

    def postmaster_pid(self) -> int | None:
        lines = self._pid_file()
        try:
            return int(lines[0])
        except (IndexError, ValueError):
            return None

    def _is_our_postmaster(self, pid: int) -> bool:
        # A postmaster works in its data folder; a pid reused by another program (after a
        # reboot, say) does not. Unknowable without /proc access: then assume it is ours.
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return True
        return os.path.realpath(cwd) == os.path.realpath(self.pgdata)

    def answers(self, timeout: float = 2.0) -> bool:
        """A PostgreSQL answers on the cluster's socket (even one still starting up)."""
        lines = self._pid_file()
        try:
            port = int(lines[3])
            folder = lines[4].strip() or str(self.socket_dir)
        except (IndexError, ValueError):
            return False
        path = os.path.join(folder, f".s.PGSQL.{port}")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                s.connect(path)
                s.sendall(_SSL_REQUEST)
                return len(s.recv(1)) == 1
            except OSError:
                return False

    def state(self) -> State:
        """stopped: no server. running: ours, and it answers. stale: a postmaster.pid left by a
        server that is gone (killed, or a zombie no one reaped). unresponsive: our postmaster
        still exists but does not answer (starting, shutting down, or dying)."""
        pid = self.postmaster_pid()
        if pid is None:
            return "stopped"
        if not _process_running(pid) or not self._is_our_postmaster(pid):
            return "stale"
        return "running" if self.answers() else "unresponsive"

    def running(self) -> bool:
        """A postmaster of ours exists (answering or not): stop() has something to stop."""
        return self.state() in ("running", "unresponsive")

    def settle(self, timeout: float = 30.0) -> Literal["stopped", "running"]:
        """Wait until the cluster is plainly running or plainly stopped.

        A server killed with SIGKILL leaves its pid file, maybe a zombie under that pid, and
        for a moment its backends, which still hold the shared memory. Wait for those to go,
        then clear what PostgreSQL would take for a live server (a lock file naming a pid
        that can still be signalled), so the next start recovers instead of refusing.
        """
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            if state == "running":
                # Adopted: the port is the one it listens on, whatever we were told.
                with contextlib.suppress(IndexError, ValueError):
                    self.port = int(self._pid_file()[3])
                return state
            if state == "stopped":
                return state
            if state == "stale":
                self._clear_stale(deadline)
                return "stopped"
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"PostgreSQL (pid {self.postmaster_pid()}) in {self.pgdata} is not answering "
                    f"after {timeout:g}s; stop it (kill it if need be) and try again"
                )
            time.sleep(0.2)

    def _clear_stale(self, deadline: float) -> None:
        lines = self._pid_file()
        pid = self.postmaster_pid()
        shmid = None
        with contextlib.suppress(IndexError, ValueError):
            shmid = int(lines[6].split()[1])
        while shmid is not None and _shared_memory_attached(shmid) > 0:
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"processes of an earlier PostgreSQL in {self.pgdata} are still running "
                    f"(they hold its shared memory {shmid}); stop them and try again"
                )
            time.sleep(0.2)
        if pid is None or not signal_possible(pid):
            return  # PostgreSQL replaces a lock file whose pid is gone by itself
        lock_files = [self.pgdata / "postmaster.pid", *self.socket_dir.glob(".s.PGSQL.*.lock")]
        for lock in lock_files:
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int(lock.read_text().splitlines()[0]) == pid:
                    lock.unlink()

    # -- start and stop --------------------------------------------------------------
    def _write_hba(self) -> None:
        # Rewritten on every start, so a cluster made before passwords were used gets them.
        hba = self.pgdata / "pg_hba.conf"
        hba.write_text(
            "# Written by sftq (LocalCluster) on every start.\n"
            "# The socket's folder is 0700: only the cluster's owner (and root) reach it.\n"
            "local all all                trust\n"
            "host  all all 127.0.0.1/32   scram-sha-256\n"
            "host  all all ::1/128        scram-sha-256\n",
            encoding="utf-8",
        )
        os.chmod(hba, 0o600)
        self._chown(hba)

    def _set_password(self, reload: bool) -> None:
        import psycopg
        from psycopg import sql

        assert self.password is not None
        try:
            with psycopg.connect(
                self.socket_conninfo(), autocommit=True, connect_timeout=10
            ) as conn:
                # A SCRAM verifier computed here: the password itself never travels in a
                # statement, so no server log can keep it.
                verifier = conn.pgconn.encrypt_password(
                    self.password.encode(), b"postgres", b"scram-sha-256"
                ).decode()
                conn.execute(
                    sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(verifier))
                )
                if reload:
                    conn.execute("SELECT pg_reload_conf()")
        except psycopg.Error as exc:
            raise ClusterError(f"could not set the superuser's password: {exc}") from exc

    def start(self, timeout: float = 60.0) -> None:
        self.init()
        if self.password:
            self._write_hba()
        if self.settle() == "running":
            if self.password:
                self._set_password(reload=True)
            return
        opts = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.socket_dir}'",
            **self.settings,
        }
        o = " ".join(f"-c {k}={v}" for k, v in opts.items())
        log = self.log_path
        self._run(
            self._tool("pg_ctl"),
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
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise ClusterError(f"PostgreSQL did not start; see {log}")
        if self.password:
            self._set_password(reload=False)

    def stop(self, mode: str = "fast") -> None:
        if self.initialized() and self.running():
            self._run(self._tool("pg_ctl"), "stop", "-D", str(self.pgdata), "-m", mode, "-w")

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.data_dir, ignore_errors=True)
