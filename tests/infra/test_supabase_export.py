"""`sftq db export --supabase`: supabase/migrations/ is up to date with sql/ (the CI check),
a database built from those files with psql (as `supabase db push` applies them) has the
same catalog as one built by `sftq db migrate`, and the export only ever appends."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from infra_support import ROOT
from pytest_postgresql.janitor import DatabaseJanitor

from sftq_server.db import migrate as migrate
from sftq_server.dev.pgcluster import LocalCluster

PSQL = shutil.which("psql")
EXPORTED = ROOT / "supabase" / "migrations"

# One query per kind of object; each row is plain text, so two catalogs compare as sets.
# Privileges as a sorted list of grants: an ACL's order says which GRANT ran first (the files
# pushed over the years re-run the repeatable part), not what anyone may do.
def _acl(column: str) -> str:
    return f"(SELECT array_agg(g::text ORDER BY g::text) FROM unnest({column}) g)::text"


CATALOG = {
    "schemas": f"""SELECT n.nspname, pg_get_userbyid(n.nspowner), {_acl('n.nspacl')}
                    FROM pg_namespace n WHERE n.nspname IN ('sftq', 'sftq_migrations')""",
    "tables": f"""SELECT c.oid::regclass::text, c.relkind, pg_get_userbyid(c.relowner),
                        c.relrowsecurity, c.relforcerowsecurity, {_acl('c.relacl')},
                        obj_description(c.oid, 'pg_class')
                   FROM pg_class c
                  WHERE c.relnamespace IN ('sftq'::regnamespace, 'sftq_migrations'::regnamespace)
                    AND c.relkind IN ('r', 'p', 'v', 'm', 'S')""",
    "columns": """SELECT a.attrelid::regclass::text, a.attname,
                         format_type(a.atttypid, a.atttypmod),
                         a.attnotnull, a.attidentity, pg_get_expr(d.adbin, d.adrelid),
                         a.attnum, col_description(a.attrelid, a.attnum)
                    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                   WHERE c.relnamespace IN ('sftq'::regnamespace, 'sftq_migrations'::regnamespace)
                     AND a.attnum > 0 AND NOT a.attisdropped""",
    "indexes": """SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index i
                   JOIN pg_class c ON c.oid = i.indrelid
                  WHERE c.relnamespace IN ('sftq'::regnamespace,
                                           'sftq_migrations'::regnamespace)""",
    "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
                        FROM pg_constraint
                       WHERE connamespace IN ('sftq'::regnamespace,
                                              'sftq_migrations'::regnamespace)""",
    "functions": f"""SELECT p.oid::regprocedure::text, pg_get_userbyid(p.proowner), p.prosecdef,
                           p.provolatile, p.proconfig::text, {_acl('p.proacl')},
                           md5(pg_get_functiondef(p.oid)), obj_description(p.oid, 'pg_proc')
                      FROM pg_proc p WHERE p.pronamespace = 'sftq'::regnamespace""",
    "views": """SELECT c.oid::regclass::text, md5(pg_get_viewdef(c.oid)) FROM pg_class c
                 WHERE c.relnamespace = 'sftq'::regnamespace AND c.relkind IN ('v', 'm')""",
    "triggers": """SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(t.oid)
                     FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                    WHERE c.relnamespace = 'sftq'::regnamespace AND NOT t.tgisinternal""",
    "policies": """SELECT tablename, policyname, permissive, roles::text, cmd, qual, with_check
                     FROM pg_policies WHERE schemaname = 'sftq'""",
    "types": """SELECT t.oid::regtype::text, t.typtype, pg_get_userbyid(t.typowner) FROM pg_type t
                 WHERE t.typnamespace = 'sftq'::regnamespace AND t.typrelid = 0
                   AND t.typelem = 0""",
    "bookkeeping": "SELECT name, kind, checksum FROM sftq_migrations.applied",
}


def catalog(url: str) -> dict[str, set[tuple[Any, ...]]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {kind: set(conn.execute(sql).fetchall()) for kind, sql in CATALOG.items()}


def new_database(cluster: LocalCluster, name: str) -> DatabaseJanitor:
    janitor = DatabaseJanitor(user="postgres", host="127.0.0.1", port=cluster.port, dbname=name)
    janitor.init()
    return janitor


def push(url: str, folder: Path) -> None:
    """Apply the files as `supabase db push` does: in version order, each in one transaction."""
    assert PSQL is not None, "psql is not installed"
    for path in sorted(folder.glob("*.sql")):
        done = subprocess.run([PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-1", "-d", url,
                               "-f", str(path)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (path.name, done.stderr)


def test_the_export_is_up_to_date_with_sql() -> None:
    result = migrate.export_supabase(check=True)
    assert not result.changed, (
        "supabase/migrations/ is out of date with sql/: run `sftq db export --supabase` and "
        "commit the result\n" + "\n".join(result.lines))


def test_pushed_files_build_the_same_database_as_the_migrator(pg_cluster: LocalCluster) -> None:
    assert EXPORTED.is_dir() and any(EXPORTED.glob("*.sql"))
    migrated, pushed = new_database(pg_cluster, "t_export_migrated"), \
        new_database(pg_cluster, "t_export_pushed")
    try:
        migrate.migrate(pg_cluster.url_for("t_export_migrated"))
        push(pg_cluster.url_for("t_export_pushed"), EXPORTED)
        a, b = catalog(pg_cluster.url_for("t_export_migrated")), \
            catalog(pg_cluster.url_for("t_export_pushed"))
        assert a["tables"] and a["functions"] and a["policies"]
        for kind in CATALOG:
            assert a[kind] == b[kind], (kind, sorted(a[kind] - b[kind])[:5],
                                        sorted(b[kind] - a[kind])[:5])
        # The two paths agree on what is applied: the migrator finds nothing left to do.
        status = migrate.status(pg_cluster.url_for("t_export_pushed"))
        assert not status.pending and not status.changed and not status.tampered
        assert migrate.migrate(pg_cluster.url_for("t_export_pushed")) == []
    finally:
        migrated.drop()
        pushed.drop()


@pytest.fixture
def sql_copy(tmp_path: Path) -> Path:
    root = tmp_path / "sql"
    shutil.copytree(ROOT / "sql", root)
    return root


def test_the_export_only_appends(sql_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "supabase" / "migrations"
    t0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    first = migrate.export_supabase(sql_copy, out, now=t0)
    names = sorted(p.name for p in out.iterdir())
    assert names[0].startswith("20260102030405_sftq_0001_")
    assert names[-1].endswith("_sftq_repeatable.sql") and first.changed
    before = {p.name: p.read_text() for p in out.iterdir()}
    assert not migrate.export_supabase(sql_copy, out, check=True).changed

    # A new migration and a changed procedure: two new files after the others, nothing edited.
    more = sql_copy / "migrations" / "9999_more.sql"
    more.write_text("ALTER TABLE sftq.jobs ADD COLUMN x int;\n")
    proc = sql_copy / "procedures" / "000_common.sql"
    proc.write_text(proc.read_text() + "\n-- changed\n")
    check = migrate.export_supabase(sql_copy, out, check=True, now=t0)
    assert check.changed and sorted(p.name for p in out.iterdir()) == names
    migrate.export_supabase(sql_copy, out, now=t0)
    after = {p.name: p.read_text() for p in out.iterdir()}
    assert {k: after[k] for k in before} == before
    added = sorted(set(after) - set(before))
    assert len(added) == 2 and added[0].endswith("_sftq_9999_more.sql")
    assert added[1].endswith("_sftq_repeatable.sql") and added[0] > names[-1]

    # An exported migration is never edited.
    more.write_text(more.read_text() + "-- edited\n")
    with pytest.raises(migrate.MigrationError, match="changed after it was exported"):
        migrate.export_supabase(sql_copy, out)
    # --rebuild starts again (for a project that never pushed).
    rebuilt = migrate.export_supabase(sql_copy, out, rebuild=True, now=t0)
    assert any(line.startswith("removed ") for line in rebuilt.lines)
    assert len(list(out.iterdir())) == len(names) + 1


def test_the_command_line(tmp_path: Path) -> None:
    import sys

    sftq = Path(sys.executable).parent / "sftq"
    done = subprocess.run([str(sftq), "db", "export", "--supabase", "--check"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "up to date with sql/" in done.stdout


def test_an_edited_procedure_exports_only_itself_and_the_grants(sql_copy: Path,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "supabase" / "migrations"
    t0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    migrate.export_supabase(sql_copy, out, now=t0)
    before = set(out.iterdir())
    proc = sql_copy / "procedures" / "065_forecast.sql"
    proc.write_text(proc.read_text() + "\n-- changed\n")
    migrate.export_supabase(sql_copy, out, now=t0)
    (added,) = set(out.iterdir()) - before
    text = added.read_text()
    shipped = [line.removeprefix("-- >>> sql/") for line in text.splitlines()
               if line.startswith("-- >>> sql/")]
    grants = sorted(f"grants/{p.name}" for p in (sql_copy / "grants").glob("*.sql"))
    assert shipped == ["procedures/065_forecast.sql", *grants]
    # About the procedure's own lines and the grants' (with a few lines of bookkeeping per
    # file), not the whole repeatable part again.
    own = len(proc.read_text().splitlines()) + sum(
        len((sql_copy / g).read_text().splitlines()) for g in grants)
    whole = sum(len(p.read_text().splitlines()) for sub in ("procedures", "views", "grants")
                for p in (sql_copy / sub).glob("*.sql"))
    # The bookkeeping is counted per file shipped: each new grants file adds its own few.
    assert len(text.splitlines()) < own + 8 * len(shipped) < whole / 4
    # The manifest now holds the edited file's checksum: nothing more to write.
    assert not migrate.export_supabase(sql_copy, out, check=True).changed


def test_without_a_manifest_the_exported_records_say_what_was_applied(sql_copy: Path,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "supabase" / "migrations"
    migrate.export_supabase(sql_copy, out, now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    migrate.manifest_path(out).unlink()
    again = migrate.export_supabase(sql_copy, out, check=True)
    # Only the manifest is missing; the files already carry every repeatable file's checksum.
    assert again.lines == [f"would write {migrate.MANIFEST}"]
