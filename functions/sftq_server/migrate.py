"""The migrator: numbered forward-only migrations, then repeatable procedure, view and
grant files. Each file runs in its own transaction under a transaction-scoped advisory
lock, so two migrators started at once apply every file exactly once between them."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

MIGRATION_LOCK = (7355608, 0)
REPEATABLE_DIRS = ("procedures", "views", "grants")

_BOOKKEEPING = """
CREATE SCHEMA IF NOT EXISTS sftq_migrations;
CREATE TABLE IF NOT EXISTS sftq_migrations.applied (
    name        text PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('versioned', 'repeatable')),
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE sftq_migrations.applied IS 'Files applied by sftq db migrate, with their SHA-256.';
"""


class MigrationError(Exception):
    pass


@dataclass(frozen=True)
class SqlFile:
    name: str  # e.g. migrations/0001_core_schema.sql
    kind: str  # versioned | repeatable
    path: Path

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


@dataclass
class Status:
    applied: list[tuple[str, str]] = field(default_factory=list)  # (name, applied_at)
    pending: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # repeatable files to re-apply
    tampered: list[str] = field(default_factory=list)  # applied migrations edited since
    missing: list[str] = field(default_factory=list)  # applied migrations gone from disk


def sql_dir() -> Path:
    """sql/ beside the package in a checkout, or SFTQ_SQL_DIR."""
    env = os.environ.get("SFTQ_SQL_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "sql"


def plan(root: Path | None = None) -> list[SqlFile]:
    root = root or sql_dir()
    if not (root / "migrations").is_dir():
        raise MigrationError(f"no migrations folder under {root}; set SFTQ_SQL_DIR")
    files = [
        SqlFile(f"migrations/{p.name}", "versioned", p)
        for p in sorted((root / "migrations").glob("*.sql"))
    ]
    for sub in REPEATABLE_DIRS:
        files += [
            SqlFile(f"{sub}/{p.name}", "repeatable", p) for p in sorted((root / sub).glob("*.sql"))
        ]
    return files


def _applied(conn: psycopg.Connection[Any]) -> dict[str, tuple[str, str]]:
    exists = conn.execute("SELECT to_regclass('sftq_migrations.applied') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    rows = conn.execute(
        "SELECT name, checksum, applied_at::text FROM sftq_migrations.applied"
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def status(database_url: str, root: Path | None = None) -> Status:
    files = plan(root)
    with psycopg.connect(database_url, autocommit=True, prepare_threshold=None) as conn:
        applied = _applied(conn)
    st = Status()
    on_disk = {f.name for f in files}
    for f in files:
        if f.name not in applied:
            st.pending.append(f.name)
        elif applied[f.name][0] != f.checksum:
            (st.tampered if f.kind == "versioned" else st.changed).append(f.name)
        else:
            st.applied.append((f.name, applied[f.name][1]))
    st.missing = sorted(n for n in applied if n.startswith("migrations/") and n not in on_disk)
    return st


def migrate(database_url: str, root: Path | None = None, *, log: Any = None) -> list[str]:
    """Apply what is pending; return the names applied. Refuses to run when an applied
    migration was edited (its checksum changed) or vanished."""
    files = plan(root)
    done: list[str] = []
    with psycopg.connect(database_url, autocommit=True, prepare_threshold=None) as conn:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", MIGRATION_LOCK)
            conn.execute(_BOOKKEEPING)
        applied = _applied(conn)
        tampered = [
            f.name
            for f in files
            if f.kind == "versioned" and f.name in applied and applied[f.name][0] != f.checksum
        ]
        names = {f.name for f in files}
        missing = [n for n in applied if n.startswith("migrations/") and n not in names]
        if tampered or missing:
            raise MigrationError(
                "refusing to migrate: "
                + "; ".join(
                    [f"{n} was changed after it was applied" for n in tampered]
                    + [f"{n} was applied but is missing" for n in missing]
                )
                + ". Applied migrations are never edited: add a new numbered file instead."
            )
        for f in files:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", MIGRATION_LOCK)
                row = conn.execute(
                    "SELECT checksum, applied_at < (SELECT max(applied_at)"
                    "  FROM sftq_migrations.applied WHERE name NOT LIKE 'grants/%%')"
                    "  FROM sftq_migrations.applied WHERE name = %s",
                    (f.name,),
                ).fetchone()
                checksum = f.checksum
                # Grants re-run whenever anything else was applied after them: a re-created
                # function comes back with the default privileges. Decided under the lock from
                # the bookkeeping, so two migrators at once do it once between them.
                stale_grants = f.name.startswith("grants/") and row is not None and bool(row[1])
                if row is not None and row[0] == checksum and not stale_grants:
                    continue  # applied already (perhaps by a concurrent migrator)
                if row is not None and f.kind == "versioned":
                    raise MigrationError(f"{f.name} was changed after it was applied")
                try:
                    conn.execute(f.text.encode("utf-8"))
                except psycopg.Error as exc:
                    raise MigrationError(f"{f.name} failed: {exc}") from exc
                conn.execute(
                    "INSERT INTO sftq_migrations.applied (name, kind, checksum)"
                    " VALUES (%s, %s, %s) ON CONFLICT (name) DO UPDATE"
                    " SET checksum = EXCLUDED.checksum, applied_at = clock_timestamp()",
                    (f.name, f.kind, checksum),
                )
            done.append(f.name)
            if log is not None:
                log(f"applied {f.name}")
    return done
