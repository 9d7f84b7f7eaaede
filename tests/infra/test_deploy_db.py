"""`infra/deploy.sh db` for real, against a database of the private test cluster on loopback:
the real sftq migrator and the real psql. The login roles it makes get exactly what their
group role allows: the API's can call the api_* procedures and nothing else, the analyst's
can read the analyst views and nothing else. And the step fails loudly, naming the statement
that fixes each finding, when Supabase's Data API could reach the queue: anon or authenticated
granted the schema, or PostgREST's in-database setting exposing it (stand-in roles anon,
authenticated and authenticator in the test cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from infra_support import DEPLOY
from psycopg import errors


def _as(db_url: str, role: str) -> psycopg.Connection[Any]:
    info = psycopg.conninfo.conninfo_to_dict(db_url) | {"user": role}
    # The test cluster trusts loopback: this checks privileges, not passwords.
    return psycopg.connect(**info, autocommit=True)  # type: ignore[arg-type]


@pytest.fixture
def logins(conn: psycopg.Connection[Any]) -> Iterator[tuple[str, str]]:
    """Login role names unique to this test (roles belong to the whole cluster)."""
    tag = uuid.uuid4().hex[:8]
    api, analyst = f"t_api_{tag}", f"t_analyst_{tag}"
    yield api, analyst
    for role in (api, analyst):
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def _deploy_db(db_url: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    if not (Path(sys.executable).parent / "sftq").exists():
        pytest.fail("the sftq command is not installed beside this Python (pip install -e .)")
    full = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(tmp_path), "LANG": "C.UTF-8", "SUPABASE_DB_URL": db_url, **env}
    return subprocess.run(["bash", str(DEPLOY), "db"], env=full, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)


def test_db_step_migrates_and_makes_least_privilege_logins(
        db_url: str, conn: psycopg.Connection[Any], logins: tuple[str, str],
        tmp_path: Path) -> None:
    api, analyst = logins
    env = {"SFTQ_API_DB_PASSWORD": "api-password-0123456789", "SFTQ_API_LOGIN_ROLE": api,
           "SFTQ_ANALYST_DB_PASSWORD": "analyst-password-0123456789",
           "SFTQ_ANALYST_LOGIN_ROLE": analyst}
    r = _deploy_db(db_url, tmp_path, **env)
    assert r.returncode == 0, r.stderr
    assert "nothing to apply: up to date" in r.stdout  # the template was migrated already
    assert "password-0123456789" not in r.stdout + r.stderr

    names = ([api, analyst],)
    roles = dict(conn.execute(
        "SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname = ANY(%s)", names).fetchall())
    assert roles == {api: True, analyst: True}
    settings = dict(conn.execute(
        "SELECT r.rolname, s.setconfig FROM pg_db_role_setting s "
        "JOIN pg_roles r ON r.oid = s.setrole WHERE r.rolname = ANY(%s)", names).fetchall())
    assert settings == {api: ["statement_timeout=30s", "jit=off"],
                        analyst: ["statement_timeout=5min", "jit=off"]}
    owned = conn.execute("SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner "
                         "WHERE r.rolname = ANY(%s)", names).fetchone()
    assert owned == (0,)

    with _as(db_url, api) as c:
        assert c.execute("SELECT (sftq.api_health()->>'database')").fetchone() == ("ok",)
        for sql in ("SELECT count(*) FROM sftq.jobs", "SELECT count(*) FROM sftq.api_keys",
                    "SELECT count(*) FROM sftq.analyst_jobs", "SELECT sftq.create_user('mallory')",
                    "SELECT * FROM sftq.admit(100)"):
            with pytest.raises(errors.InsufficientPrivilege):
                c.execute(sql)

    with _as(db_url, analyst) as c:
        assert c.execute("SELECT count(*) FROM sftq.analyst_jobs").fetchone() == (0,)
        for sql in ("SELECT count(*) FROM sftq.jobs", "SELECT count(*) FROM sftq.api_keys",
                    "SELECT sftq.api_health()", "SELECT sftq.create_user('mallory')"):
            with pytest.raises(errors.InsufficientPrivilege):
                c.execute(sql)

    # Running it again is harmless: same roles, one membership each, new password accepted.
    env["SFTQ_API_DB_PASSWORD"] = "another-password-0123456789"
    r = _deploy_db(db_url, tmp_path, **env)
    assert r.returncode == 0, r.stderr
    members = conn.execute(
        "SELECT m.rolname, g.rolname FROM pg_auth_members a JOIN pg_roles m ON m.oid = a.member "
        "JOIN pg_roles g ON g.oid = a.roleid WHERE m.rolname = ANY(%s)", names).fetchall()
    assert sorted(members) == sorted([(api, "sftq_api"), (analyst, "sftq_analyst")])


def test_db_step_stops_on_an_unreachable_database(tmp_path: Path) -> None:
    r = _deploy_db("postgresql://postgres:nope-nope-nope@127.0.0.1:9/postgres", tmp_path)
    assert r.returncode != 0


# ---- the Data API check (infra/sql/check_data_api.sql) fails the step loudly ---------------

STAND_IN_ROLES = """
DO $$ BEGIN
    -- Supabase's Data API roles, and the role PostgREST logs in as (cluster-wide).
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'anon') THEN
        CREATE ROLE anon NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'authenticated') THEN
        CREATE ROLE authenticated NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'authenticator') THEN
        CREATE ROLE authenticator NOLOGIN NOINHERIT;
    END IF;
END $$;
"""


@pytest.fixture
def data_api_roles(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    conn.execute(STAND_IN_ROLES)
    try:
        yield conn
    finally:  # a role's settings outlive this test's database: take them back
        conn.execute("ALTER ROLE authenticator RESET pgrst.db_schemas")
        conn.execute(f'ALTER ROLE authenticator IN DATABASE "{conn.info.dbname}" '
                     "RESET pgrst.db_schemas")


def _refused(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Supabase's Data API could reach schema sftq" in r.stderr
    assert "run infra/deploy.sh db again" in r.stderr
    return r.stderr


def test_db_step_passes_with_the_data_api_roles_present(
        db_url: str, data_api_roles: psycopg.Connection[Any], tmp_path: Path) -> None:
    """No false alarm: the roles exist, PostgREST exposes other schemas, the step passes;
    it says what it could not check without the Management API, and how to check it."""
    data_api_roles.execute("ALTER ROLE authenticator SET pgrst.db_schemas = "
                           "'public, graphql_public, sftq_reports'")
    r = _deploy_db(db_url, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "SUPABASE_ACCESS_TOKEN is not set" in r.stderr
    assert "exposed schemas was NOT checked" in r.stderr
    assert "only the in-database pgrst.db_schemas settings were" in r.stderr
    assert "Settings > API > Exposed schemas" in r.stderr
    assert "https://api.supabase.com/v1/projects/<project-ref>/postgrest" in r.stderr


@pytest.mark.parametrize("role", ["anon", "authenticated"])
def test_db_step_fails_when_a_data_api_role_can_use_the_schema(
        db_url: str, data_api_roles: psycopg.Connection[Any], tmp_path: Path,
        role: str) -> None:
    conn = data_api_roles
    conn.execute(f"GRANT USAGE ON SCHEMA sftq TO {role}")
    conn.execute(f"GRANT SELECT ON sftq.jobs TO {role}")
    stderr = _refused(_deploy_db(db_url, tmp_path))
    # Each thing found, with the statement that takes it back.
    assert (f"{role} can use schema sftq (fix: REVOKE ALL ON SCHEMA sftq FROM {role})"
            in stderr)
    assert f"{role} has SELECT on sftq.jobs (fix: REVOKE ALL ON sftq.jobs FROM {role})" in stderr
    # The fixes it names are enough: run them, and the step passes.
    conn.execute(f"REVOKE ALL ON SCHEMA sftq FROM {role}")
    conn.execute(f"REVOKE ALL ON sftq.jobs FROM {role}")
    r = _deploy_db(db_url, tmp_path)
    assert r.returncode == 0, r.stderr


def test_db_step_fails_when_postgrest_exposes_sftq(
        db_url: str, data_api_roles: psycopg.Connection[Any], tmp_path: Path) -> None:
    """The in-database PostgREST setting, as a Supabase or self-hosted PostgREST keeps it on
    the role it logs in as, for every database or only for this one."""
    conn = data_api_roles
    conn.execute("ALTER ROLE authenticator SET pgrst.db_schemas = 'public, sftq'")
    stderr = _refused(_deploy_db(db_url, tmp_path))
    assert ("pgrst.db_schemas=public, sftq is set for role authenticator: sftq is among the "
            "Data API's exposed schemas (fix: ALTER ROLE authenticator SET pgrst.db_schemas = "
            "'public', then NOTIFY pgrst, 'reload config')") in stderr

    conn.execute("ALTER ROLE authenticator SET pgrst.db_schemas = 'public'")
    dbname = conn.info.dbname
    conn.execute(f'ALTER ROLE authenticator IN DATABASE "{dbname}" '
                 "SET pgrst.db_schemas = 'sftq'")
    stderr = _refused(_deploy_db(db_url, tmp_path))
    assert (f'fix: ALTER ROLE authenticator IN DATABASE {dbname} RESET pgrst.db_schemas'
            in stderr)
    conn.execute(f'ALTER ROLE authenticator IN DATABASE "{dbname}" RESET pgrst.db_schemas')
    r = _deploy_db(db_url, tmp_path)
    assert r.returncode == 0, r.stderr
