"""The database's defence in depth (sql/grants/090_security.sql): row-level security on every
table, nothing for Supabase's Data API roles, SECURITY DEFINER functions owned by a NOLOGIN
role that owns nothing else, and loops that cover tables and functions added later."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import psycopg
import pytest

from .conftest import Q

GRANTS = Path(__file__).resolve().parents[2] / "sql" / "grants"
Conn = psycopg.Connection[Any]


def reapply_grants(conn: Conn, also_in_roles: str = "") -> None:
    """What the migrator does after any other file ran: every grants file, in name order;
    `also_in_roles` stands for grants another branch adds to 010_roles.sql."""
    for path in sorted(GRANTS.glob("*.sql")):
        conn.execute(path.read_text(encoding="utf-8").encode())
        if path.name == "010_roles.sql" and also_in_roles:
            conn.execute(also_in_roles)


def data_api_roles(conn: Conn) -> None:
    """Supabase's anon and authenticated (roles belong to the whole test cluster)."""
    conn.execute("""
        DO $$ BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'anon') THEN
                CREATE ROLE anon NOLOGIN;
            END IF;
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'authenticated') THEN
                CREATE ROLE authenticated NOLOGIN;
            END IF;
        END $$""")


def tables(conn: Conn) -> list[tuple[str, bool]]:
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT c.relname, c.relrowsecurity FROM pg_class c "
        "WHERE c.relnamespace = 'sftq'::regnamespace AND c.relkind IN ('r', 'p') ORDER BY 1")]


def policies(conn: Conn) -> dict[tuple[str, str], tuple[list[str], str, int]]:
    rows = conn.execute(
        "SELECT p.tablename, p.policyname, p.roles, p.qual, pol.oid::int FROM pg_policies p "
        "JOIN pg_policy pol ON pol.polname = p.policyname "
        " AND pol.polrelid = format('%I.%I', p.schemaname, p.tablename)::regclass "
        "WHERE p.schemaname = 'sftq'").fetchall()
    return {(r[0], r[1]): (list(r[2]), r[3], r[4]) for r in rows}


def test_every_table_has_row_level_security_and_policies_only_for_project_roles(
        conn: Conn) -> None:
    found = tables(conn)
    assert {"jobs", "users", "api_keys", "job_events", "scheduler_ticks"} <= {t for t, _ in found}
    assert [t for t, rls in found if not rls] == []
    roles = {role for (roles, _, _) in policies(conn).values() for role in roles}
    assert roles == {"sftq_definer", "sftq_scheduler"}
    # The scheduler gets a policy only where it has a table right: never on api_keys.
    assert ("api_keys", "sftq_scheduler_rows") not in policies(conn)
    assert ("jobs", "sftq_scheduler_rows") in policies(conn)


def test_the_data_api_roles_get_nothing_and_see_no_row(q: Q) -> None:
    conn = q.conn
    data_api_roles(conn)
    q.user("alice")
    q.enqueue(q.user("bob"))
    # What Supabase's default privileges would hand them if sftq were created like public.
    conn.execute("GRANT USAGE ON SCHEMA sftq TO anon, authenticated, PUBLIC")
    conn.execute("GRANT ALL ON ALL TABLES IN SCHEMA sftq TO anon, authenticated, PUBLIC")
    conn.execute("GRANT ALL ON ALL FUNCTIONS IN SCHEMA sftq TO anon, authenticated")
    reapply_grants(conn)
    for role in ("anon", "authenticated", "public"):
        assert q.one("SELECT has_schema_privilege(%s, 'sftq', 'USAGE')", role) is False, role
        granted = q.all(
            "SELECT c.relname, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a "
            "WHERE c.relnamespace = 'sftq'::regnamespace "
            "AND a.grantee = coalesce((SELECT oid FROM pg_roles WHERE rolname = %s), 0)", role)
        assert granted == [], (role, granted)
        functions = q.all(
            "SELECT p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.pronamespace = 'sftq'::regnamespace "
            "AND EXISTS (SELECT 1 FROM aclexplode(p.proacl) a "
            "WHERE a.grantee = coalesce((SELECT oid FROM pg_roles WHERE rolname = %s), 0))", role)
        assert functions == [], (role, functions)
    # Defence in depth: even a table grant that slips back in shows anon no row.
    conn.execute("GRANT USAGE ON SCHEMA sftq TO anon")
    conn.execute("GRANT SELECT ON sftq.jobs, sftq.users, sftq.api_keys TO anon")
    try:
        with conn.transaction():
            conn.execute("SET LOCAL ROLE anon")
            for table in ("jobs", "users", "api_keys"):
                assert q.one(f"SELECT count(*) FROM sftq.{table}") == 0, table
    finally:
        conn.execute("REVOKE ALL ON SCHEMA sftq FROM anon")
        conn.execute("REVOKE ALL ON sftq.jobs, sftq.users, sftq.api_keys FROM anon")
    assert q.one("SELECT count(*) FROM sftq.users") == 2  # the owner still sees everything


def test_security_definer_functions_belong_to_a_nologin_role_that_owns_nothing_else(
        conn: Conn) -> None:
    owners = dict(conn.execute(
        "SELECT p.oid::regprocedure::text, r.rolname FROM pg_proc p "
        "JOIN pg_roles r ON r.oid = p.proowner "
        "WHERE p.pronamespace = 'sftq'::regnamespace AND p.prosecdef").fetchall())
    assert any(name.startswith("sftq.api_enqueue(") for name in owners)
    assert set(owners.values()) == {"sftq_definer"}, owners
    role = conn.execute(
        "SELECT rolcanlogin, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb, rolreplication "
        "FROM pg_roles WHERE rolname = 'sftq_definer'").fetchone()
    assert role == (False, False, False, False, False, False)
    owned = conn.execute("""
        SELECT 'relation ' || c.oid::regclass::text FROM pg_class c
         WHERE c.relowner = 'sftq_definer'::regrole
        UNION ALL
        SELECT 'schema ' || n.nspname FROM pg_namespace n WHERE n.nspowner = 'sftq_definer'::regrole
        UNION ALL
        SELECT 'function ' || p.oid::regprocedure::text FROM pg_proc p
         WHERE p.proowner = 'sftq_definer'::regrole AND NOT p.prosecdef
        UNION ALL
        SELECT 'database ' || d.datname FROM pg_database d WHERE d.datdba = 'sftq_definer'::regrole
        UNION ALL
        SELECT 'type ' || t.typname FROM pg_type t
         WHERE t.typowner = 'sftq_definer'::regrole AND t.typrelid = 0""").fetchall()
    assert owned == []
    # No DDL: it holds DML on the tables and nothing that could change the schema.
    assert conn.execute("SELECT has_schema_privilege('sftq_definer', 'sftq', 'CREATE')"
                        ).fetchone() == (False,)
    extra = conn.execute(
        "SELECT DISTINCT a.privilege_type FROM pg_class c, aclexplode(c.relacl) a "
        "WHERE c.relnamespace = 'sftq'::regnamespace AND a.grantee = 'sftq_definer'::regrole "
        "AND a.privilege_type NOT IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE', 'USAGE')"
        ).fetchall()
    assert extra == []


def test_the_api_still_works_through_the_definer(q: Q) -> None:
    q.user("alice")
    key = q.one("SELECT key FROM sftq.issue_key('alice')")
    digest = hashlib.sha256(key.encode()).digest()
    q.conn.execute("SET ROLE sftq_api")
    try:
        body = q.one("SELECT body FROM sftq.api_enqueue(%s, 'SFT', '{}'::jsonb, 'x', 4, NULL)",
                     digest)
        assert body["state"] == "QUEUED"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            q.conn.execute("SELECT count(*) FROM sftq.jobs")
    finally:
        q.conn.execute("RESET ROLE")


def test_the_loops_cover_tables_and_functions_added_later(q: Q) -> None:
    """Another file adds a table and a SECURITY DEFINER function: the next migrate's grants
    pass covers both with no edit to 090_security.sql."""
    conn = q.conn
    conn.execute("CREATE TABLE sftq.t_added_later (id bigint GENERATED ALWAYS AS IDENTITY "
                 "PRIMARY KEY, note text)")
    conn.execute("INSERT INTO sftq.t_added_later (note) VALUES ('one'), ('two')")
    conn.execute("""
        CREATE FUNCTION sftq.api_t_added_later() RETURNS bigint
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
        AS $$ SELECT count(*) FROM sftq.t_added_later $$""")
    reapply_grants(conn, "GRANT SELECT, INSERT ON sftq.t_added_later TO sftq_scheduler")
    assert ("t_added_later", True) in tables(conn)
    found = policies(conn)
    assert found[("t_added_later", "sftq_definer_rows")][:2] == (["sftq_definer"], "true")
    assert found[("t_added_later", "sftq_scheduler_rows")][:2] == (["sftq_scheduler"], "true")
    assert q.one("SELECT r.rolname FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner "
                 "WHERE p.oid = 'sftq.api_t_added_later()'::regprocedure") == "sftq_definer"
    assert q.one("SELECT sftq.api_t_added_later()") == 2  # the definer sees the rows
    with conn.transaction():
        conn.execute("SET LOCAL ROLE sftq_scheduler")
        assert q.one("SELECT count(*) FROM sftq.t_added_later") == 2
        conn.execute("INSERT INTO sftq.t_added_later (note) VALUES ('three')")


def test_reapplying_changes_nothing(conn: Conn) -> None:
    before = policies(conn)
    reapply_grants(conn)
    reapply_grants(conn)
    assert policies(conn) == before  # same policy oids: nothing dropped and made again


def test_a_changed_policy_is_put_back(conn: Conn) -> None:
    conn.execute("DROP POLICY sftq_definer_rows ON sftq.api_keys")
    conn.execute("CREATE POLICY sftq_definer_rows ON sftq.api_keys TO sftq_definer USING (true)")
    conn.execute("CREATE POLICY sftq_stale_rows ON sftq.jobs TO sftq_definer USING (true)")
    reapply_grants(conn)
    found = policies(conn)
    assert found[("api_keys", "sftq_definer_rows")][1] == (
        "((NOT pg_is_in_recovery()) OR sftq._replica_fresh())")
    assert ("jobs", "sftq_stale_rows") not in found


def test_a_non_superuser_migrator_like_supabases_postgres(pg_cluster: Any) -> None:
    """Supabase's `postgres` is not a superuser: it must still hand the functions to
    sftq_definer, replace them on a later migrate, and end with a working API."""
    from sftq_server.db import migrate as migrate

    procedures = sorted((GRANTS.parent / "procedures").glob("*.sql"))
    with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
        admin.execute("CREATE ROLE t_migrator LOGIN CREATEROLE")
        admin.execute("CREATE DATABASE t_nonsuper OWNER t_migrator")
    url = f"postgresql://t_migrator@127.0.0.1:{pg_cluster.port}/t_nonsuper"
    try:
        migrate.migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            for path in procedures:  # what a later migrate does with a changed procedure
                conn.execute(path.read_text(encoding="utf-8").encode())
            reapply_grants(conn)
            owners = conn.execute(
                "SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc "
                "WHERE pronamespace = 'sftq'::regnamespace AND prosecdef").fetchall()
            assert owners == [("sftq_definer",)]
            assert conn.execute("SELECT has_schema_privilege('sftq_definer', 'sftq', 'CREATE')"
                                ).fetchone() == (False,)
            conn.execute("SELECT sftq.create_user('nina')")
            key = conn.execute("SELECT key FROM sftq.issue_key('nina')").fetchone()
            assert key is not None
            digest = hashlib.sha256(key[0].encode()).digest()
            row = conn.execute("SELECT body FROM sftq.api_enqueue(%s, 'SFT', '{}'::jsonb, 'x', "
                               "4, NULL)", (digest,)).fetchone()
            assert row is not None and row[0]["state"] == "QUEUED"
    finally:
        with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS t_nonsuper")
            admin.execute("REVOKE sftq_definer FROM t_migrator")
            admin.execute("DROP ROLE IF EXISTS t_migrator")
