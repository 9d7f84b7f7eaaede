"""The embedded PostgreSQL of `sftq dev`: private to its owner, startable by root from a private
folder with the pip package's binaries, and back on the first start after a crash."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from conftest import (
    SFT_PAYLOAD,
    DevStacks,
    alive,
    cmdline,
    descendants,
    free_port,
    postmaster_pid,
    wait_until,
)

from sftq_server.dev.pgcluster import BINARY_CACHE, LocalCluster

AS_ROOT = os.geteuid() == 0


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def without_password(url: str, password: str | None = None) -> str:
    parts = urlsplit(url)
    auth = "postgres" if password is None else f"postgres:{password}"
    return urlunsplit(parts._replace(netloc=f"{auth}@{parts.hostname}:{parts.port}"))


def refused(url: str) -> str:
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(url, connect_timeout=5).close()
    return str(caught.value)


def submit(values: dict[str, str]) -> str:
    r = httpx.post(
        f"{values['SUPABASE_URL']}/functions/v1/jobs-api/jobs",
        headers={"Authorization": f"Bearer {values['SFTQ_API_KEY']}"},
        json={"kind": "SFT", "fireworks_payload": SFT_PAYLOAD},
    )
    assert r.status_code == 201, r.text
    job_id: str = r.json()["id"]
    return job_id


def job_state(values: dict[str, str], job_id: str) -> str:
    r = httpx.get(
        f"{values['SUPABASE_URL']}/functions/v1/jobs-api/jobs/{job_id}",
        headers={"Authorization": f"Bearer {values['SFTQ_API_KEY']}"},
    )
    assert r.status_code == 200, r.text
    state: str = r.json()["state"]
    return state


def test_the_dev_database_wants_the_password_of_the_env_file(
    stacks: DevStacks, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "pg.port").write_text(f"{free_port()}\n")
    dev = stacks.start(data_dir)
    values = dev.wait_ready()
    url = values["DATABASE_URL"]
    password = urlsplit(url).password
    assert password and len(password) >= 32

    # The URL works; the same URL without the password, or with another, does not: over TCP
    # the server asks every local user for the password (it used to trust anyone).
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    assert "password" in refused(without_password(url))
    assert "password authentication failed" in refused(without_password(url, "0" * 48))

    # What keeps the secrets: the data dir and the env file are the owner's alone, and so are
    # the cluster's folder, its socket's folder (the socket itself trusts who reaches it) and
    # the server log.
    cluster = (data_dir / "pg").resolve()
    assert mode(data_dir) == 0o700 and mode(data_dir / "env") == 0o600
    assert mode(cluster) == 0o700 and mode(cluster / "sockets") == 0o700
    assert mode(cluster / "pgdata") == 0o700 and mode(cluster / "postgres.log") == 0o600
    assert f"DATABASE_URL={url}" in (data_dir / "env").read_text()
    if AS_ROOT:
        # Another local user cannot even reach the socket.
        socket_path = next((cluster / "sockets").glob(".s.PGSQL.*[0-9]"))
        probe = subprocess.run(
            [
                "runuser",
                "-u",
                "nobody",
                "--",
                "/usr/bin/python3",
                "-c",
                f"import socket; socket.socket(socket.AF_UNIX).connect({str(socket_path)!r})",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert probe.returncode != 0 and "PermissionError" in probe.stderr, probe.stderr

    dev.send(signal.SIGTERM)
    assert dev.wait() == 0, dev.log()
    # Set from a verifier computed by the client: the password never reached the server's log.
    assert password not in (cluster / "postgres.log").read_text()

    # The next start keeps the password (the env file has it).
    again = stacks.start(data_dir)
    assert again.wait_ready()["DATABASE_URL"] == url
    again.send(signal.SIGTERM)
    assert again.wait() == 0, again.log()


@pytest.mark.parametrize("left_running", [False, True], ids=["stopped", "left-running"])
def test_a_cluster_made_before_passwords_gets_one_and_keeps_its_data(
    stacks: DevStacks, tmp_path: Path, left_running: bool
) -> None:
    # A data dir from an earlier version: the cluster inside it, trusting every local login;
    # maybe still running, left by a supervisor that was killed -9.
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    port = free_port()
    (data_dir / "pg.port").write_text(f"{port}\n")
    old = LocalCluster(data_dir / "pg", port=port)
    old.start()
    try:
        with psycopg.connect(old.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE sftq")
        with psycopg.connect(old.url_for("sftq"), autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)")
    finally:
        if not left_running:
            old.stop()

    dev = stacks.start(data_dir)
    url = dev.wait_ready()["DATABASE_URL"]
    assert "password" in refused(without_password(url))
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM kept").fetchone() == (42,)
    if AS_ROOT:
        # As root the cluster moved out of the (now 0700) data dir, to where postgres may go.
        assert (data_dir / "pg").is_symlink() and "moving the embedded PostgreSQL" in dev.log()
    assert mode(data_dir) == 0o700
    dev.send(signal.SIGTERM)
    assert dev.wait() == 0, dev.log()


# A parent that never reaps its orphans, like pid 1 in many containers: a process killed with
# SIGKILL stays a zombie under its old pid, so "is that pid alive?" answers yes.
NO_REAPER = (
    "import ctypes, signal, subprocess, sys\n"
    "ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans come to us\n"
    "child = subprocess.Popen(sys.argv[1:])\n"
    "signal.pause()\n"
)


def test_a_crashed_stack_starts_again_at_once(stacks: DevStacks, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "pg.port").write_text(f"{free_port()}\n")
    port, sim_port = free_port(), free_port()
    first = stacks.start(
        data_dir,
        port=port,
        simulator_port=sim_port,
        tick_interval=30,
        wrapper=(sys.executable, "-c", NO_REAPER),
    )
    values = first.wait_ready()
    job_id = submit(values)
    pg_pid = postmaster_pid(data_dir)
    assert pg_pid is not None
    # With a client connected, so that a backend dies with the server too.
    conn = psycopg.connect(values["DATABASE_URL"])

    # An OOM kill or a power cut: SIGKILL to the supervisor, every child and every PostgreSQL
    # process, all at once. Nothing is stopped in order and nothing is cleaned up.
    victims = descendants(first.pid)
    assert pg_pid in victims and len(victims) >= 5, {p: cmdline(p) for p in victims}
    try:
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):  # gone with one killed before it
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not any(alive(p) for p in victims), 10, "the killed processes to die")
    finally:
        conn.close()
    assert postmaster_pid(data_dir) == pg_pid  # its pid file is still there
    assert Path(f"/proc/{pg_pid}").exists()  # and so is the pid, a zombie nobody reaps

    # Start again at once: the first start recovers.
    again = stacks.start(data_dir, port=port, simulator_port=sim_port)
    values2 = again.wait_ready(timeout=90)
    assert values2 == values
    assert "adopting" not in again.log()
    assert job_state(values2, job_id) == "QUEUED"
    new_pid = postmaster_pid(data_dir)
    assert new_pid is not None and new_pid != pg_pid and alive(new_pid)

    again.send(signal.SIGTERM)
    assert again.wait() == 0, again.log()
    wait_until(lambda: not alive(new_pid), 15, "PostgreSQL to stop")


def _pgserver_bindir() -> Path:
    pgserver = pytest.importorskip("pgserver")
    return Path(pgserver.__file__).parent / "pginstall" / "bin"


@pytest.mark.skipif(not AS_ROOT, reason="the postgres user only matters as root")
def test_root_runs_the_stack_from_a_private_folder_with_the_embedded_binaries(
    stacks: DevStacks, tmp_path: Path
) -> None:
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres user")
    # A clone under a private home folder (0700, like /root), its virtualenv holding pgserver:
    # the same layout as site-packages/{pgserver/pginstall, pgserver.libs}.
    source = _pgserver_bindir().parent.parent.parent
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chmod(home, 0o700)
    site = home / "clone" / ".venv" / "site-packages"
    shutil.copytree(
        source / "pgserver" / "pginstall",
        site / "pgserver" / "pginstall",
        ignore=shutil.ignore_patterns("include"),
    )
    shutil.copytree(source / "pgserver.libs", site / "pgserver.libs")
    bindir = site / "pgserver" / "pginstall" / "bin"
    cant = subprocess.run(
        ["runuser", "-u", "postgres", "--", str(bindir / "initdb"), "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cant.returncode != 0, "the postgres user should not reach a 0700 folder"

    cached_before = set(BINARY_CACHE.glob("postgres-*"))
    clone = home / "clone"
    try:
        dev = stacks.start(
            clone / ".sftq",
            cwd=clone,
            env={"SFTQ_PG_BINDIR": str(bindir)},
            extra=(),
        )
        values = dev.wait_ready()
        assert "using a copy in" in dev.log(), dev.log()
        pg_pid = postmaster_pid(clone / ".sftq")
        assert pg_pid is not None
        exe = os.readlink(f"/proc/{pg_pid}/exe")
        assert exe.startswith(str(BINARY_CACHE)), exe
        assert job_state(values, submit(values)) == "QUEUED"
        # Nothing was opened up to get there.
        assert mode(home) == 0o700 and mode(clone / ".sftq") == 0o700

        dev.send(signal.SIGTERM)
        assert dev.wait() == 0, dev.log()

        # The copy is made once: the next start uses it as it is.
        again = stacks.start(clone / ".sftq", cwd=clone, env={"SFTQ_PG_BINDIR": str(bindir)})
        again.wait_ready()
        assert set(BINARY_CACHE.glob("postgres-*")) - cached_before <= {Path(exe).parents[3]}
        again.send(signal.SIGTERM)
        assert again.wait() == 0, again.log()
    finally:
        for made in set(BINARY_CACHE.glob("postgres-*")) - cached_before:
            shutil.rmtree(made, ignore_errors=True)


def _fake_installation(root: Path) -> Path:
    """A tiny self-contained PostgreSQL layout (scripts for binaries); its bin/."""
    for name in ("postgres", "initdb", "pg_ctl"):
        tool = root / "bin" / name
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text(f"#!/bin/sh\necho '{name} (PostgreSQL) 16.0'\n")
        tool.chmod(0o755)
    (root / "lib").mkdir()
    (root / "lib" / "plpgsql.so").write_bytes(b"\0" * 16)
    (root / "share" / "postgresql").mkdir(parents=True)
    (root / "share" / "postgresql" / "postgres.bki").write_text("# catalog\n")
    (root / "include").mkdir()
    (root / "include" / "postgres.h").write_text("/* not copied */\n")
    return root / "bin"


def _links_to(real_bindir: Path, folder: Path) -> Path:
    """A ~/bin-like folder: links to the server tools, among files that are not PostgreSQL's."""
    folder.mkdir(parents=True)
    for name in ("postgres", "initdb", "pg_ctl"):
        (folder / name).symlink_to(real_bindir / name)
    return folder


def test_a_folder_of_symlinks_copies_the_installation_it_points_into(tmp_path: Path) -> None:
    # Issue 18.1: SFTQ_PG_BINDIR=~/bin holding links to the real binaries. A copy takes the
    # installation the links lead to, never the folder around the links (~, with everything).
    from sftq_server.dev.pgcluster import _copy_for_postgres

    real = _fake_installation(tmp_path / "opt" / "pg16")
    home = tmp_path / "home"
    links = _links_to(real, home / "bin")
    (home / "bin" / "my-script").write_text("#!/bin/sh\n")
    (home / "projects").mkdir()
    (home / "projects" / "big.dat").write_bytes(b"x" * 4096)

    copied = _copy_for_postgres(links, tmp_path / "cache")
    target = copied.parent
    assert copied.name == "bin" and target.parent == tmp_path / "cache"
    held = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert held == [".complete", "bin/initdb", "bin/pg_ctl", "bin/postgres", "lib/plpgsql.so",
                    "share/postgresql/postgres.bki"]  # fmt: skip
    assert not (copied / "postgres").is_symlink()


def test_binaries_that_are_not_one_installation_are_refused_naming_sftq_pg_bindir(
    tmp_path: Path,
) -> None:
    from sftq_server.dev.pgcluster import ClusterError, _copy_for_postgres, installation_root

    real = _fake_installation(tmp_path / "pg")
    assert installation_root(_links_to(real, tmp_path / "ok")) == real.parent.resolve()
    assert installation_root(real) == real.parent.resolve()

    # Links into a folder that is not a bin/ of an installation.
    loose = tmp_path / "loose"
    loose.mkdir()
    for name in ("postgres", "initdb", "pg_ctl"):
        shutil.copy2(real / name, loose / name)
    # An installation without its share/ (initdb could not run from a copy of it).
    bare = _fake_installation(tmp_path / "bare")
    shutil.rmtree(bare.parent / "share")
    # Tools from two installations.
    other = _fake_installation(tmp_path / "other")
    mixed = _links_to(real, tmp_path / "mixed")
    (mixed / "initdb").unlink()
    (mixed / "initdb").symlink_to(other / "initdb")
    # A tool missing, or a dangling link.
    missing = _links_to(real, tmp_path / "missing")
    (missing / "pg_ctl").unlink()
    (missing / "pg_ctl").symlink_to(tmp_path / "nowhere")

    for bindir, why in (
        (_links_to(loose, tmp_path / "to-loose"), "which is not a bin/ folder"),
        (_links_to(bare, tmp_path / "to-bare"), "no share/ folder with postgres.bki"),
        (mixed, "lead to different folders"),
        (missing, "does not exist"),
    ):
        with pytest.raises(ClusterError) as caught:
            _copy_for_postgres(bindir, tmp_path / "cache")
        assert "SFTQ_PG_BINDIR" in str(caught.value) and why in str(caught.value), caught.value
    assert not (tmp_path / "cache").exists()  # nothing was copied
