"""The analyst role through the drivers analysts use: psycopg (libpq) and pg8000 (pure Python,
for notebooks without libpq). The Python examples in docs/analysts.md run verbatim as an
analyst login; each driver also shows that the role reads the views and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pg8000.dbapi
import psycopg
import pytest
from infra_support import ROOT, WANDB_SECRET, seed

from sftq_server.cli.db import set_login_role

DOC = ROOT / "docs" / "analysts.md"
PASSWORD = "analyst-driver-pass-0123456789"


def python_blocks(driver: str) -> list[str]:
    import re

    return re.findall(rf"^```python {driver}\n(.*?)^```$", DOC.read_text(encoding="utf-8"),
                      re.S | re.M)


@pytest.fixture
def analyst(conn: psycopg.Connection[Any], db_url: str) -> Iterator[str]:
    """A fresh analyst login (made as deploy.sh makes them), its URL with the password."""
    seed(conn)
    login = f"t_analyst_{uuid.uuid4().hex[:8]}"
    set_login_role(db_url, login, "sftq_analyst", PASSWORD, "5min")
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    yield f"postgresql://{login}:{PASSWORD}@{info['host']}:{info['port']}/{info['dbname']}"
    conn.execute(f'DROP ROLE IF EXISTS "{login}"')


@pytest.mark.parametrize("driver", ["psycopg", "pg8000"])
def test_the_guides_python_examples_run(analyst: str, driver: str) -> None:
    blocks = python_blocks(driver)
    assert len(blocks) == 1, f"docs/analysts.md lost its {driver} example"
    env = {**os.environ, "SFTQ_ANALYST_DATABASE_URL": analyst, "PGSSLMODE": "disable"}
    done = subprocess.run([sys.executable, "-c", blocks[0]], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert {"ana SUCCESS 1", "cy CANCELLED 1", "bo FAIL 1"} <= set(lines), lines


def test_psycopg_reads_the_views_and_nothing_else(analyst: str) -> None:
    with psycopg.connect(analyst, autocommit=True, sslmode="disable") as conn:
        rows = conn.execute("SELECT id, fireworks_payload FROM sftq.analyst_jobs").fetchall()
        assert rows and WANDB_SECRET not in repr(rows)
        for forbidden in ("SELECT * FROM sftq.api_keys", "SELECT * FROM sftq.jobs",
                          "SELECT sftq.create_user('mallory')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(forbidden)


def test_pg8000_reads_the_views_and_nothing_else(analyst: str) -> None:
    info = psycopg.conninfo.conninfo_to_dict(analyst)
    conn = pg8000.dbapi.connect(user=info["user"], password=info["password"], host=info["host"],
                                port=int(info["port"]), database=info["dbname"])
    try:
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("SELECT id, fireworks_payload, gpu_hours FROM sftq.analyst_jobs")
        rows = cur.fetchall()
        assert rows and WANDB_SECRET not in repr(rows)
        cur.execute("SELECT * FROM sftq.analyst_daily")
        assert cur.fetchall()
        for forbidden in ("SELECT * FROM sftq.api_keys", "SELECT * FROM sftq.jobs",
                          "SELECT sftq.create_user('mallory')"):
            with pytest.raises(pg8000.dbapi.DatabaseError) as refused:
                cur.execute(forbidden)
            assert refused.value.args[0]["C"] == "42501"  # insufficient_privilege
    finally:
        conn.close()


def test_an_analyst_login_runs_without_jit_unless_asked_to_keep_it(
        analyst: str, db_url: str) -> None:
    # PostgreSQL's default is jit = on; the guide's `WHERE fifo_rank <= 100` would then be
    # compiled at every run (its estimated cost is that of numbering the whole queue).
    login = str(psycopg.conninfo.conninfo_to_dict(analyst)["user"])

    def role_settings() -> list[str]:
        with psycopg.connect(db_url, autocommit=True) as admin:
            row = admin.execute("SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r "
                                "ON r.oid = s.setrole WHERE r.rolname = %s", (login,)).fetchone()
            return list(row[0]) if row else []

    def session_jit() -> str:
        with psycopg.connect(analyst, autocommit=True, sslmode="disable") as conn:
            row = conn.execute("SHOW jit").fetchone()
            assert row is not None
            return str(row[0])

    assert role_settings() == ["statement_timeout=5min", "jit=off"]
    assert session_jit() == "off"
    set_login_role(db_url, login, "sftq_analyst", PASSWORD, "5min", keep_jit=True)
    assert role_settings() == ["statement_timeout=5min"]  # the server's setting applies
