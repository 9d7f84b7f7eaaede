"""`sftq db migrate|status|login-role|export`."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

# Group roles a login may join (made by the migrations; each owns nothing).
LOGIN_GROUPS = ("sftq_api", "sftq_analyst", "sftq_scheduler")
MIN_PASSWORD_CHARS = 16
_ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_TIMEOUT = re.compile(r"[0-9]+\s*(ms|s|min|h)?")


def set_login_role(database_url: str, login: str, member_of: str, password: str,
                   statement_timeout: str | None, *, keep_jit: bool = False) -> bool:
    """Create or update `login`, a member of `member_of`. The password reaches the server only
    as a SCRAM-SHA-256 verifier computed here (libpq's PQencryptPasswordConn), so no statement
    text, log line or pg_stat_statements entry ever holds it. True if the role is new.

    The role gets `jit = off` unless keep_jit: PostgreSQL compiles a plan whose estimated
    cost passes jit_above_cost, and the planner's estimates for the queue's views and
    functions are far above what they cost to run (an analyst's `WHERE fifo_rank <= 100`,
    well under a millisecond, compiles for about ten; docs/analysts.md). keep_jit resets the
    role's own setting, so the server's applies."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(database_url, autocommit=True, prepare_threshold=None) as conn:
        verifier = conn.pgconn.encrypt_password(
            password.encode(), login.encode(), b"scram-sha-256").decode()
        with conn.transaction():
            exists = conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s",
                                  (login,)).fetchone() is not None
            verb = sql.SQL("ALTER" if exists else "CREATE")
            conn.execute(sql.SQL("{} ROLE {} WITH LOGIN INHERIT PASSWORD {}").format(
                verb, sql.Identifier(login), sql.Literal(verifier)))
            conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(member_of),
                                                          sql.Identifier(login)))
            if statement_timeout:
                conn.execute(sql.SQL("ALTER ROLE {} SET statement_timeout = {}").format(
                    sql.Identifier(login), sql.Literal(statement_timeout)))
            conn.execute(sql.SQL("ALTER ROLE {} RESET jit" if keep_jit
                                 else "ALTER ROLE {} SET jit = off").format(sql.Identifier(login)))
    return not exists


def _cmd_login_role(args: argparse.Namespace, url: str) -> int:
    if not _ROLE_NAME.fullmatch(args.login):
        print(f"error: login role name {args.login!r} must be lower case letters, digits and _",
              file=sys.stderr)
        return 2
    if args.statement_timeout and not _TIMEOUT.fullmatch(args.statement_timeout):
        print("error: --statement-timeout looks like 30s, 5min or 500ms", file=sys.stderr)
        return 2
    # The password comes on stdin: never on a command line (ps) or in a statement (logs).
    password = sys.stdin.readline().rstrip("\r\n")
    if len(password) < MIN_PASSWORD_CHARS:
        print(f"error: the password on standard input is shorter than {MIN_PASSWORD_CHARS} "
              "characters; generate one, e.g. openssl rand -hex 24", file=sys.stderr)
        return 2
    import psycopg

    try:
        created = set_login_role(url, args.login, args.member_of, password,
                                 args.statement_timeout, keep_jit=args.keep_jit)
    except psycopg.Error as exc:
        print(f"error: {exc}".rstrip(), file=sys.stderr)
        return 1
    print(f"{'created' if created else 'updated'} login role {args.login} "
          f"(member of {args.member_of})")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from sftq_server.db import migrate as migrate

    if not args.supabase:
        print("error: say which format: --supabase", file=sys.stderr)
        return 2
    try:
        result = migrate.export_supabase(check=args.check, rebuild=args.rebuild)
    except migrate.MigrationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in result.lines:
        print(line)
    if args.check and result.changed:
        print("error: supabase/migrations/ is out of date with sql/: run "
              "`sftq db export --supabase` and commit the result", file=sys.stderr)
        return 1
    return 0


def _cmd_db(args: argparse.Namespace) -> int:
    from sftq_server.cli import database_url
    from sftq_server.db import migrate as migrate

    if args.db_cmd == "export":
        return _cmd_export(args)
    url = database_url(args)
    if args.db_cmd == "login-role":
        return _cmd_login_role(args, url)
    try:
        if args.db_cmd == "migrate":
            done = migrate.migrate(url, log=lambda line: print(line, flush=True))
            print(f"{len(done)} file(s) applied" if done else "nothing to apply: up to date")
            return 0
        st = migrate.status(url)
    except migrate.MigrationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, at in st.applied:
        print(f"applied   {name}  {at}")
    for name in st.changed:
        print(f"changed   {name}  (re-applied by the next migrate)")
    for name in st.pending:
        print(f"pending   {name}")
    for name in st.tampered:
        print(f"TAMPERED  {name}  (edited after it was applied; migrate will refuse)")
    for name in st.missing:
        print(f"MISSING   {name}  (applied but no longer on disk)")
    return 1 if st.tampered or st.missing else 0


def _database_options(p: Any) -> None:
    p.add_argument("--database-url", help="PostgreSQL URL (default: $DATABASE_URL, else .sftq/env)")
    p.add_argument("--data-dir", default=".sftq", help="dev stack folder whose env file to read")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    db = sub.add_parser("db", help="database migrations")
    db_sub = db.add_subparsers(dest="db_cmd", required=True)
    for name, help_ in (
        ("migrate", "apply pending migrations"),
        ("status", "list applied and pending files"),
    ):
        _database_options(db_sub.add_parser(name, help=help_))
    p = db_sub.add_parser(
        "login-role", help="create or update a login role in sftq_api, sftq_analyst or "
        "sftq_scheduler; its password is read from standard input",
        description="Create or update LOGIN, a member of a sftq group role. The password is "
        "read from standard input and sent only as a SCRAM-SHA-256 verifier computed here.")
    p.add_argument("login", help="the login role, e.g. sftq_api_login")
    p.add_argument("--member-of", required=True, choices=LOGIN_GROUPS)
    p.add_argument("--statement-timeout", help="a per-role ceiling on any statement, e.g. 30s")
    p.add_argument("--keep-jit", action="store_true",
                   help="leave the server's jit setting to the role (by default the role gets "
                   "jit = off: compiling the queue's plans costs more than running them)")
    _database_options(p)
    p = db_sub.add_parser(
        "export", help="write sql/ as Supabase CLI migrations (supabase/migrations/)",
        description="Write sql/ (migrations, then procedures, views and grants, in the "
        "migrator's order) as timestamped files in supabase/migrations/ for `supabase db push`. "
        "Files already there are kept: new migrations and a changed repeatable part are added "
        "as new files.")
    p.add_argument("--supabase", action="store_true", help="the Supabase CLI's layout")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if the export is out of date")
    p.add_argument("--rebuild", action="store_true",
                   help="start supabase/migrations/ afresh (only before any `supabase db push`)")
    db.set_defaults(func=_cmd_db)
