"""The migrator: numbered forward-only migrations, then repeatable procedure, view and
grant files. Each file runs in its own transaction under a transaction-scoped advisory
lock, so two migrators started at once apply every file exactly once between them."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
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
    return Path(__file__).resolve().parents[3] / "sql"


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


# ---- `sftq db export --supabase`: the same files as Supabase CLI migrations -----------------

EXPORT_MARK = "-- sftq-export: "
_EXPORTED = re.compile(r"(\d{14})_[A-Za-z0-9_]+\.sql")
BUNDLE = "repeatable"


@dataclass
class ExportResult:
    lines: list[str] = field(default_factory=list)
    changed: bool = False


def supabase_dir(root: Path | None = None) -> Path:
    """supabase/migrations beside sql/."""
    return (root or sql_dir()).resolve().parent / "supabase" / "migrations"


def _record(name: str, kind: str, checksum: str) -> str:
    return (
        "INSERT INTO sftq_migrations.applied (name, kind, checksum)\n"
        f"VALUES ('{name}', '{kind}', '{checksum}') ON CONFLICT (name) DO UPDATE\n"
        "    SET checksum = EXCLUDED.checksum, applied_at = clock_timestamp();\n"
    )


def _bundle_body(files: list[SqlFile]) -> str:
    parts = []
    for f in files:
        record = _record(f.name, f.kind, f.checksum)
        parts.append(f"-- >>> sql/{f.name}\n{f.text.rstrip()}\n\n{record}")
    return "\n".join(parts)


# What the repeatable files were at the last export: a checked-in manifest of their SHA-256
# beside supabase/migrations/ (supabase/sftq-export.json), so that the next export writes only
# the files that changed since. Without one (an export made before it existed), the same facts
# are read back from the bookkeeping records the exported files end with.
MANIFEST = "sftq-export.json"
_RECORDED = re.compile(r"VALUES \('([^']+)', 'repeatable', '([0-9a-f]{64})'\)")


def manifest_path(out: Path) -> Path:
    return out.parent / MANIFEST


def _last_exported(out: Path) -> dict[str, str]:
    """Repeatable file -> its checksum as the exported files last applied it."""
    path = manifest_path(out)
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        return {str(k): str(v) for k, v in data.get("repeatable", {}).items()}
    found: dict[str, str] = {}
    for _, _, exported in sorted(_exported(out).values()):
        for name, sha in _RECORDED.findall(exported.read_text(encoding="utf-8")):
            found[name] = sha
    return found


def _manifest_text(files: list[SqlFile]) -> str:
    repeatable = {f.name: f.checksum for f in files if f.kind == "repeatable"}
    note = ("Written by `sftq db export --supabase`: the SHA-256 of each repeatable file of "
            "sql/ as supabase/migrations/ last applied it. The next export writes only the "
            "files whose checksum differs. Do not edit.")
    return json.dumps({"note": note, "repeatable": repeatable}, indent=2) + "\n"


def _exported(out: Path) -> dict[str, tuple[str, str, Path]]:
    """What is already in supabase/migrations: source (or BUNDLE+ts) -> (timestamp, sha, path);
    files without our mark are someone else's and are left alone."""
    found: dict[str, tuple[str, str, Path]] = {}
    if not out.is_dir():
        return found
    for path in sorted(out.iterdir()):
        m = _EXPORTED.fullmatch(path.name)
        if m is None:
            continue
        with path.open(encoding="utf-8") as fh:
            head = [fh.readline() for _ in range(2)]
        mark = next((line for line in head if line.startswith(EXPORT_MARK)), None)
        if mark is None:
            continue
        source, _, sha = mark[len(EXPORT_MARK):].strip().partition(" sha256=")
        key = f"{BUNDLE}@{m[1]}" if source == BUNDLE else source
        found[key] = (m[1], sha, path)
    return found


def _timestamps(out: Path, now: datetime) -> Iterator[str]:
    """Fresh 14-digit versions, after every file already there (ours or not)."""
    taken = [int(m[1]) for p in (out.iterdir() if out.is_dir() else [])
             if (m := _EXPORTED.fullmatch(p.name))]
    start = max(int(now.strftime("%Y%m%d%H%M%S")), max(taken, default=0) + 1)
    current = datetime.strptime(str(start), "%Y%m%d%H%M%S")
    while True:
        yield current.strftime("%Y%m%d%H%M%S")
        current += timedelta(seconds=1)


def export_supabase(root: Path | None = None, out: Path | None = None, *, check: bool = False,
                    rebuild: bool = False, now: datetime | None = None) -> ExportResult:
    """Write sql/ as Supabase CLI migrations, append-only like `supabase db push` expects:
    each versioned migration once (a file per migration), then one more file with the
    repeatable files that changed since the last export (by the manifest, supabase/
    sftq-export.json), followed by the grants, whenever anything changed. Every file also
    records what it applied in sftq_migrations.applied, so `sftq db status` and
    `sftq db migrate` agree with a database built by `supabase db push`. With check=True
    nothing is written."""
    files = plan(root)
    out = out or supabase_dir(root)
    result = ExportResult()
    existing = {} if rebuild else _exported(out)
    stale = list(_exported(out).values()) if rebuild else []
    fresh = _timestamps(out if not rebuild else out / "-none-", now or datetime.now(UTC))
    writes: list[tuple[Path, str]] = []

    highest = max((k for k in existing if k.startswith("migrations/")), default="")
    for f in files:
        if f.kind != "versioned":
            continue
        if f.name in existing:
            if existing[f.name][1] != f.checksum:
                raise MigrationError(
                    f"{f.name} changed after it was exported to {existing[f.name][2].name}: "
                    "a migration is never edited; add a new numbered file")
            continue
        if f.name < highest:
            result.lines.append(f"note: {f.name} is exported after {highest}, so "
                                "`supabase db push` applies it later than `sftq db migrate` does")
        body = (f"-- Generated by `sftq db export --supabase` from sql/{f.name}; do not edit.\n"
                f"{EXPORT_MARK}{f.name} sha256={f.checksum}\n{_BOOKKEEPING}\n"
                f"{f.text.rstrip()}\n\n{_record(f.name, f.kind, f.checksum)}")
        writes.append((out / f"{next(fresh)}_sftq_{Path(f.name).stem}.sql", body))

    # The repeatable files the migrator would re-apply to a database that has every export so
    # far: those changed since (by the manifest), then the grants whenever anything else is
    # applied, as the migrator re-runs them (a re-created function comes back with the default
    # privileges). Only those go out, in the migrator's order: never the whole set again.
    last = {} if rebuild else _last_exported(out)
    repeatable = [f for f in files if f.kind == "repeatable"]
    changed = {f.name for f in repeatable if last.get(f.name) != f.checksum}
    if writes or changed:
        chosen = [f for f in repeatable if f.name in changed or f.name.startswith("grants/")]
        bundle = _bundle_body(chosen)
        digest = hashlib.sha256(bundle.encode()).hexdigest()
        sources = "\n".join(f"--   sql/{f.name}" for f in chosen)
        body = ("-- Generated by `sftq db export --supabase` from the repeatable files of sql/\n"
                f"{EXPORT_MARK}{BUNDLE} sha256={digest}\n"
                "-- that changed since the last export (then the grants, which the migrator\n"
                "-- re-runs after any change), in the migrator's order; do not edit:\n"
                f"{sources}\n\n{bundle}")
        writes.append((out / f"{next(fresh)}_sftq_{BUNDLE}.sql", body))
    manifest = _manifest_text(files)
    mpath = manifest_path(out)
    if not mpath.is_file() or mpath.read_text(encoding="utf-8") != manifest:
        writes.append((mpath, manifest))

    result.changed = bool(writes) or bool(stale)
    for _, _, path in stale:
        result.lines.append(f"{'would remove' if check else 'removed'} {path.name}")
        if not check:
            path.unlink()
    for path, body in writes:
        result.lines.append(f"{'would write' if check else 'wrote'} {path.name}")
        if not check:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(body, encoding="utf-8")
    if not result.changed:
        result.lines.append(f"{out.parent.name}/{out.name}: up to date with sql/")
    return result
