"""Every SQL example in docs/operations.md runs against a migrated database with a little
data, as the owner an operator connects as. Blocks tagged `sql cron` run in a database
with pg_cron. Blocks tagged `sql pg_net` need pg_net, which the test cluster does not have:
they are only checked to read nothing but pg_net's response table."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from infra_support import ROOT, seed, sql_blocks
from psycopg import sql

DOC = ROOT / "docs" / "operations.md"
CRON_DB = "sftq_cron"  # tests/conftest.py points pg_cron's cron.database_name here
PROBE = "sftq-scheduler-tick-docs-probe"  # matched by the docs' filter on the tick's job name


def _blocks(tag: str) -> list[str]:
    return [body for info, body in sql_blocks(DOC) if info == tag]


def test_the_doc_tags_its_blocks() -> None:
    assert {info for info, _ in sql_blocks(DOC)} <= {"sql", "sql cron", "sql pg_net"}
    assert len(_blocks("sql")) >= 8
    for body in _blocks("sql pg_net"):
        assert "net._http_response" in body and "sftq." not in body


def test_every_example_runs(conn: psycopg.Connection[Any]) -> None:
    seed(conn)
    row = conn.execute("SELECT sftq.create_user('alice')").fetchone()
    assert row is not None
    conn.execute("SELECT * FROM sftq.issue_key('alice')")
    # A webhook endpoint, and a job change that writes a delivery for it (the outbox).
    conn.execute("SELECT sftq.webhook_create(%s, gen_random_uuid(), 'https://hooks.example.com/',"
                 " ARRAY['job.*'], NULL, 'v0:x')", (row[0],))
    conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (row[0],))
    # A job the tick could not handle once (the job-faults query shows it).
    conn.execute("SELECT sftq.record_job_fault(id, 1, 'preflight', 'InvalidURL', 'x', 3)"
                 "  FROM sftq.jobs WHERE user_id = %s", (row[0],))
    for body in _blocks("sql"):
        try:
            cur = conn.execute(body)
        except psycopg.Error as exc:
            pytest.fail(f"this example fails: {exc}\n{body}")
        if cur.description is not None and body.lstrip().upper().startswith("SELECT"):
            assert cur.fetchall(), f"this example returns nothing on the test data:\n{body}"


@pytest.fixture
def cron_conn(pg_cluster: Any) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_cluster.url_for("postgres"), autocommit=True) as admin:
        loaded = admin.execute("SELECT current_setting('shared_preload_libraries')").fetchone()
        if "pg_cron" not in (loaded or ("",))[0]:
            pytest.skip("pg_cron is not installed beside this PostgreSQL")
        made = admin.execute("SELECT NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = %s)",
                             (CRON_DB,)).fetchone() == (True,)
        if made:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(CRON_DB)))
        try:
            with psycopg.connect(pg_cluster.url_for(CRON_DB), autocommit=True) as c:
                c.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
                c.execute("SELECT cron.schedule(%s, '0 0 1 1 *', 'SELECT 1')", (PROBE,))
                try:
                    yield c
                finally:
                    c.execute("SELECT cron.unschedule(%s)", (PROBE,))
        finally:
            if made:
                drop = sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(CRON_DB))
                admin.execute(drop)


def test_cron_examples_run_where_pg_cron_is(cron_conn: psycopg.Connection[Any]) -> None:
    bodies = _blocks("sql cron")
    assert bodies
    for body in bodies:
        rows = cron_conn.execute(body).fetchall()
        assert any(r[0] == PROBE for r in rows), rows
