"""`sftq db migrate|status`."""

from __future__ import annotations

import argparse
import sys


def _cmd_db(args: argparse.Namespace) -> int:
    from . import migrate
    from .cli import database_url

    url = database_url(args)
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


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    db = sub.add_parser("db", help="database migrations")
    db_sub = db.add_subparsers(dest="db_cmd", required=True)
    for name, help_ in (
        ("migrate", "apply pending migrations"),
        ("status", "list applied and pending files"),
    ):
        p = db_sub.add_parser(name, help=help_)
        p.add_argument(
            "--database-url", help="PostgreSQL URL (default: $DATABASE_URL, else .sftq/env)"
        )
        p.add_argument(
            "--data-dir", default=".sftq", help="dev stack folder whose env file to read"
        )
    db.set_defaults(func=_cmd_db)
