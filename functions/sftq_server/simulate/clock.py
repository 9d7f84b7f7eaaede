"""The virtual clock of a replay, inside a throw-away database.

Every stored procedure reads the time from PostgreSQL (`now()`, `clock_timestamp()`, or a
`p_now` parameter whose default is `now()`), and the tick's Python phases call them without a
clock. Rather than thread a clock argument through the production code, a replay's own
database is migrated as usual and then every function, procedure and column default whose
text reads the server's clock is re-created with that call replaced by `sftq_sim.now()` or
`sftq_sim.clock_timestamp()`, which read a one-row table the replay moves forward. The
procedures' logic is byte for byte the production text otherwise; production databases are
never touched, so their hot paths cost nothing more.

`sftq_sim.now()` is constant between two moves (as `now()` is within a transaction);
`sftq_sim.clock_timestamp()` adds one microsecond per call, so that rows created at the same
virtual moment keep the order they were written in (enqueue stamps `created_at` with it).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import psycopg

SCHEMA = "sftq_sim"

SETUP_SQL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.clock (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    t timestamptz NOT NULL);
CREATE SEQUENCE IF NOT EXISTS {SCHEMA}.micro;
CREATE OR REPLACE FUNCTION {SCHEMA}.now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT t FROM {SCHEMA}.clock $$;
CREATE OR REPLACE FUNCTION {SCHEMA}.clock_timestamp() RETURNS timestamptz
LANGUAGE sql VOLATILE AS $$
    SELECT t + pg_catalog.nextval('{SCHEMA}.micro') * interval '1 microsecond'
      FROM {SCHEMA}.clock $$;
GRANT USAGE ON SCHEMA {SCHEMA} TO PUBLIC;
GRANT SELECT ON {SCHEMA}.clock TO PUBLIC;
GRANT USAGE ON SEQUENCE {SCHEMA}.micro TO PUBLIC;
"""

# What reads the server's clock, and what replaces it. One alternation, one pass: the
# replacement itself contains "now()" and must not be rewritten again.
_CLOCK_CALL = re.compile(
    r"(?<![\w.])(?:pg_catalog\.)?(now|clock_timestamp|statement_timestamp|transaction_timestamp)"
    r"\s*\(\s*\)|(?<![\w.])(current_timestamp|localtimestamp)\b(?!\s*\()",
    re.IGNORECASE)
_OURS = SCHEMA + r"\.(now|clock_timestamp)\(\)"
_VOLATILE = {"clock_timestamp", "statement_timestamp"}
_FINDS = (r"(now|clock_timestamp|statement_timestamp|transaction_timestamp)\s*\(\s*\)"
          r"|current_timestamp|localtimestamp")


def rewrite(text: str) -> str:
    """`text` with every reading of the server's clock turned into the virtual clock's."""
    def swap(match: re.Match[str]) -> str:
        name = (match.group(1) or match.group(2)).lower()
        fn = "clock_timestamp" if name in _VOLATILE else "now"
        return f"{SCHEMA}.{fn}()"
    return _CLOCK_CALL.sub(swap, text)


def install(conn: psycopg.Connection[Any], start: datetime) -> int:
    """Put the virtual clock into a migrated database (as its owner, autocommit) at `start`.
    Returns how many functions and column defaults were re-created."""
    conn.execute(SETUP_SQL, prepare=False)
    conn.execute(f"INSERT INTO {SCHEMA}.clock (t) VALUES (%s) "
                 "ON CONFLICT (only_row) DO UPDATE SET t = EXCLUDED.t", (start,))
    changed = 0
    functions = conn.execute(
        """SELECT pg_catalog.pg_get_functiondef(p.oid)
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', %s)
              AND n.nspname NOT LIKE 'pg\\_%%'
              AND p.prokind IN ('f', 'p')
              AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                               WHERE d.classid = 'pg_catalog.pg_proc'::regclass
                                 AND d.objid = p.oid AND d.deptype = 'e')
              AND (p.prosrc ~* %s
                   OR pg_catalog.pg_get_expr(p.proargdefaults, 0) ~* %s)""",
        (SCHEMA, _FINDS, _FINDS)).fetchall()
    for (definition,) in functions:
        new = rewrite(definition)
        if new != definition:
            conn.execute(new, prepare=False)
            changed += 1
    defaults = conn.execute(
        """SELECT n.nspname, c.relname, a.attname, pg_catalog.pg_get_expr(d.adbin, d.adrelid)
             FROM pg_catalog.pg_attrdef d
             JOIN pg_catalog.pg_class c ON c.oid = d.adrelid
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
            WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', %s)
              AND pg_catalog.pg_get_expr(d.adbin, d.adrelid) ~* %s""",
        (SCHEMA, _FINDS)).fetchall()
    for schema, table, column, expr in defaults:
        conn.execute(psycopg.sql.SQL("ALTER TABLE {}.{} ALTER COLUMN {} SET DEFAULT ").format(
            psycopg.sql.Identifier(schema), psycopg.sql.Identifier(table),
            psycopg.sql.Identifier(column)).as_string(conn) + rewrite(expr))
        changed += 1
    return changed


def leftovers(conn: psycopg.Connection[Any]) -> list[str]:
    """Functions of ours that still read the server's clock (none after install)."""
    rows = conn.execute(
        """SELECT p.oid::regprocedure::text
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'sftq'
              AND (pg_catalog.regexp_replace(p.prosrc, %s, '', 'gi') ~* %s
                   OR pg_catalog.regexp_replace(COALESCE(
                          pg_catalog.pg_get_expr(p.proargdefaults, 0), ''), %s, '', 'gi') ~* %s)""",
        (_OURS, _FINDS, _OURS, _FINDS)).fetchall()
    return [str(r[0]) for r in rows]


def set_time(conn: psycopg.Connection[Any], at: datetime) -> None:
    """Move the virtual clock to `at` (autocommit)."""
    conn.execute(f"WITH moved AS (UPDATE {SCHEMA}.clock SET t = %s RETURNING 1) "
                 f"SELECT pg_catalog.setval('{SCHEMA}.micro', 1, false) FROM moved", (at,))
