"""The migrator: empty -> migrated; again -> nothing; tampered files refused; two at once."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pytest_postgresql.janitor import DatabaseJanitor

from sftq_server.db import migrate as migrate
from sftq_server.dev.pgcluster import LocalCluster


@pytest.fixture
def empty_url(pg_cluster: LocalCluster) -> Any:
    janitor = DatabaseJanitor(
        user="postgres", host="127.0.0.1", port=pg_cluster.port, dbname="empty_mig"
    )
    janitor.init()
    try:
        yield pg_cluster.url_for("empty_mig")
    finally:
        janitor.drop()


def _schema_snapshot(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as c:
        return c.execute("""
            SELECT 'rel', c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'sftq'
            UNION ALL
            SELECT 'fn', p.proname, md5(pg_get_functiondef(p.oid)) FROM pg_proc p
              JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'sftq'
            UNION ALL
            SELECT 'applied', name, checksum || applied_at::text FROM sftq_migrations.applied
            ORDER BY 1, 2, 3""").fetchall()


def test_empty_database_is_migrated_and_a_second_run_changes_nothing(empty_url: str) -> None:
    applied = migrate.migrate(empty_url)
    assert applied[0] == "migrations/0001_core_schema.sql"
    assert any(a.startswith("procedures/") for a in applied) and any(
        a.startswith("views/") for a in applied
    )
    before = _schema_snapshot(empty_url)
    assert migrate.migrate(empty_url) == []
    assert _schema_snapshot(empty_url) == before
    st = migrate.status(empty_url)
    assert not st.pending and not st.tampered and len(st.applied) == len(applied)
    with psycopg.connect(empty_url) as c:
        assert c.execute("SELECT count(*) FROM sftq.jobs").fetchone() == (0,)


def _copy_sql(tmp_path: Path) -> Path:
    root = tmp_path / "sql"
    shutil.copytree(migrate.sql_dir(), root)
    return root


def test_tampered_applied_migration_is_refused(empty_url: str, tmp_path: Path) -> None:
    root = _copy_sql(tmp_path)
    migrate.migrate(empty_url, root)
    first = root / "migrations" / "0001_core_schema.sql"
    first.write_text(first.read_text() + "\n-- edited\n")
    with pytest.raises(migrate.MigrationError, match="0001_core_schema.sql was changed"):
        migrate.migrate(empty_url, root)
    assert migrate.status(empty_url, root).tampered == ["migrations/0001_core_schema.sql"]


def test_new_migration_and_changed_procedure_are_applied(empty_url: str, tmp_path: Path) -> None:
    root = _copy_sql(tmp_path)
    migrate.migrate(empty_url, root)
    (root / "migrations" / "9999_extra.sql").write_text("CREATE TABLE sftq.extra (id int);\n")
    proc = root / "procedures" / "000_common.sql"
    proc.write_text(proc.read_text() + "\n-- a comment\n")
    st = migrate.status(empty_url, root)
    assert st.pending == ["migrations/9999_extra.sql"] and st.changed == [
        "procedures/000_common.sql"
    ]
    applied = migrate.migrate(empty_url, root)
    assert applied[:2] == ["migrations/9999_extra.sql", "procedures/000_common.sql"]
    assert "grants/010_roles.sql" in applied  # privileges re-applied after a procedure changed
    assert migrate.migrate(empty_url, root) == []


def test_two_migrators_at_once_apply_each_file_once(empty_url: str) -> None:
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(migrate.migrate(empty_url))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    combined = sorted(results[0] + results[1])
    assert combined == sorted(set(combined))  # nothing applied twice
    assert len(combined) == len(migrate.plan())


@pytest.mark.filterwarnings("ignore:XDG_RUNTIME_DIR")
def test_migrates_an_empty_postgresql_16_as_well(tmp_path: Path) -> None:
    """The suite runs on the machine's PostgreSQL (15 here); pgserver bundles 16."""
    pgserver = pytest.importorskip("pgserver")
    cluster = LocalCluster(
        Path("/tmp") / f"sftq-pg16-{tmp_path.name}",
        bindir=Path(pgserver.__file__).parent / "pginstall" / "bin",
    )
    try:
        cluster.start()
        with psycopg.connect(cluster.url) as c:
            assert c.execute("SHOW server_version_num").fetchone()[0].startswith("16")
        assert len(migrate.migrate(cluster.url)) == len(migrate.plan())
        assert migrate.migrate(cluster.url) == []
    finally:
        cluster.destroy()
