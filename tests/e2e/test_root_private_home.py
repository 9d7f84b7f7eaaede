"""Issue 45.2: root, from a private (0700) home, with only the embedded PostgreSQL (pgserver,
which `pip install` pulls in) and no PostgreSQL of the machine's on PATH, starts the cluster
`sftq dev` starts. The postgres user cannot enter that home, so the binaries are copied to a
cache it can read; the copy must bring the libraries they load (pgserver.libs, beside the
package, found through an $ORIGIN-relative RPATH), or initdb stops at `error while loading
shared libraries: libpq-....so.5.16`.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import sftq_server

IN_CI = bool(os.environ.get("CI"))
SYSTEM_PG = Path("/usr/lib/postgresql")

# Run in a process of its own: its PATH holds runuser and nothing else (no pg_config, initdb
# or pg_ctl; no ldd or readelf either), and pgserver is imported from the private home.
SCRIPT = """
import sys
from pathlib import Path

import pgserver
import psycopg

from sftq_server.dev.pgcluster import LocalCluster, find_bindir

home, data = Path(sys.argv[1]), Path(sys.argv[2])
assert home in Path(pgserver.__file__).resolve().parents, pgserver.__file__
bindir = find_bindir()  # what `sftq dev` looks up; SFTQ_PG_BINDIR when /usr/lib/postgresql is there
assert home in bindir.parents, bindir
cluster = LocalCluster(data, bindir=bindir, password="private-home")
try:
    cluster.start()
    with psycopg.connect(cluster.url, connect_timeout=10) as conn:
        print("SELECT 1 =", conn.execute("SELECT 1").fetchone()[0])
    print("RUNNABLE", cluster.runnable_bindir())
finally:
    cluster.stop()
"""


def _need(condition: bool, why: str) -> None:
    """Skip when `why` holds on a developer's machine; under CI (root, with pgserver and a
    postgres user) it is a broken setup, and fails."""
    if not condition:
        if IN_CI:
            pytest.fail(f"CI must run this test: {why}")
        pytest.skip(why)


def _hiding_system_postgres() -> list[str] | None:
    """A command prefix that runs a command with /usr/lib/postgresql (where find_bindir looks
    whatever PATH says) empty, in a mount namespace of its own; None when there is none to
    be had (no unshare, or no CAP_SYS_ADMIN)."""
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    if unshare is None or mount is None:
        return None
    probe = subprocess.run(
        [unshare, "--mount", "--", mount, "-t", "tmpfs", "none", "/mnt"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        return None
    hide = f"{mount} -t tmpfs none /usr/lib/postgresql && " if SYSTEM_PG.is_dir() else ""
    return [unshare, "--mount", "--", "/bin/sh", "-c", hide + 'exec "$@"', "sh"]


def test_root_starts_the_embedded_postgres_from_a_private_home_without_system_postgres(
    tmp_path: Path,
) -> None:
    _need(os.geteuid() == 0, "only root runs PostgreSQL as the postgres user (from a copy)")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        _need(False, "no postgres user (useradd --system postgres)")
    # Found, not imported: importing it warns (platformdirs), which the suite makes an error.
    spec = importlib.util.find_spec("pgserver")
    _need(spec is not None, "pgserver is not installed (pip install '.[embedded]')")
    assert spec is not None and spec.origin is not None
    runuser = shutil.which("runuser")
    _need(runuser is not None, "no runuser")
    assert runuser is not None

    # A private home (0700, like /root) with a virtualenv-like site-packages inside it: real
    # copies of pgserver and its libraries, which the postgres user cannot reach.
    source = Path(spec.origin).resolve().parent.parent
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chmod(home, 0o700)
    site = home / "project" / ".venv" / "lib" / "site-packages"
    shutil.copytree(
        source / "pgserver",
        site / "pgserver",
        ignore=shutil.ignore_patterns("include", "__pycache__"),
    )
    shutil.copytree(source / "pgserver.libs", site / "pgserver.libs")
    private_initdb = site / "pgserver" / "pginstall" / "bin" / "initdb"
    cant = subprocess.run(
        [runuser, "-u", "postgres", "--", str(private_initdb), "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cant.returncode != 0, "the postgres user should not reach into a 0700 folder"

    # PATH: runuser alone, so no PostgreSQL of the machine's is found through it.
    path_dir = tmp_path / "path"
    path_dir.mkdir()
    (path_dir / "runuser").symlink_to(runuser)
    # The cluster's folder and the cache, where the postgres user can reach them.
    os.chmod(tmp_path, 0o711)
    work = Path(tempfile.mkdtemp(prefix="sftq-private-home-"))
    os.chmod(work, 0o711)
    cache = work / "cache"
    script = home / "project" / "start.py"
    script.write_text(SCRIPT, encoding="utf-8")

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PG", "SFTQ_")) and k not in ("DATABASE_URL", "PYTHONPATH")
    }
    env |= {
        "HOME": str(home),
        "PATH": str(path_dir),
        "PYTHONPATH": os.pathsep.join([str(site), str(Path(sftq_server.__file__).parents[1])]),
        "SFTQ_CACHE_DIR": str(cache),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    command = [sys.executable, str(script), str(home), str(work / "pg")]
    hiding = _hiding_system_postgres()
    if hiding is not None:
        # The machine's PostgreSQL is gone for this process: find_bindir falls to pgserver.
        command = [*hiding, *command]
    elif any(SYSTEM_PG.glob("*/bin/pg_ctl")):
        # find_bindir would take the machine's PostgreSQL: name pgserver's binaries, as
        # find_bindir does on a machine without one.
        env["SFTQ_PG_BINDIR"] = str(private_initdb.parent)
    try:
        proc = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=180, check=False
        )
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert "SELECT 1 = 1" in proc.stdout, proc.stdout
        runnable = Path(proc.stdout.split("RUNNABLE ", 1)[1].split()[0])
        # Run from a copy in the cache, which brought pgserver's libraries along.
        assert cache in runnable.parents, runnable
        copy = next(p for p in runnable.parents if p.parent == cache)
        assert any((copy / "pgserver.libs").glob("libpq-*.so*")), sorted(copy.rglob("*"))[:20]
        # Nothing was opened up to get there.
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_libraries_found_through_origin_travel_with_a_copy() -> None:
    # Read from the binaries themselves (no ldd or readelf needed): pgserver's tools and its
    # server's modules (libpqwalreceiver.so) find libpq in pgserver.libs, beside the package.
    from sftq_server.dev.pgcluster import _elf_search_dirs, _private_library_dirs

    spec = importlib.util.find_spec("pgserver")
    _need(spec is not None, "pgserver is not installed (pip install '.[embedded]')")
    assert spec is not None and spec.origin is not None
    prefix = Path(spec.origin).resolve().parent / "pginstall"
    assert "$ORIGIN/../../../pgserver.libs" in _elf_search_dirs(prefix / "bin" / "initdb")
    assert _private_library_dirs(prefix) == {prefix.parent.parent / "pgserver.libs"}
    assert _elf_search_dirs(prefix / "share" / "postgres.bki") == []  # not ELF


def test_a_broken_copy_under_the_same_key_is_made_again(tmp_path: Path) -> None:
    from sftq_server.dev.pgcluster import _copy_for_postgres

    for name in ("postgres", "initdb", "pg_ctl"):
        tool = tmp_path / "pg" / "bin" / name
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text(f"#!/bin/sh\necho '{name} (PostgreSQL) 16.0'\n")
        tool.chmod(0o755)
    (tmp_path / "pg" / "lib").mkdir()
    (tmp_path / "pg" / "lib" / "plpgsql.so").write_bytes(b"\0" * 16)
    (tmp_path / "pg" / "share").mkdir()
    (tmp_path / "pg" / "share" / "postgres.bki").write_text("# catalog\n")
    bindir, cache = tmp_path / "pg" / "bin", tmp_path / "cache"

    copied = _copy_for_postgres(bindir, cache)
    (copied.parent / "lib" / "plpgsql.so").unlink()  # a copy that left a library behind
    assert _copy_for_postgres(bindir, cache) == copied  # taken as it is, by its key
    assert not (copied.parent / "lib" / "plpgsql.so").exists()
    assert _copy_for_postgres(bindir, cache, replace=True) == copied
    assert (copied.parent / "lib" / "plpgsql.so").exists()
    assert sorted(p.name for p in cache.iterdir()) == [copied.parent.name]  # nothing left over
