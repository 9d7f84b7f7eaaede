"""Every SQL example in docs/analysts.md runs, as the analyst role, on a migrated database
with a little data, and returns rows; none of them can show a payload secret."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from infra_support import ROOT, WANDB_SECRET, seed, sql_blocks

DOC = ROOT / "docs" / "analysts.md"


def test_the_guide_has_enough_examples() -> None:
    queries = [body for info, body in sql_blocks(DOC) if info == "sql"]
    selects = [q for q in queries if q.lstrip().upper().startswith(("SELECT", "WITH"))]
    assert len(selects) >= 8, len(selects)
    assert {info for info, _ in sql_blocks(DOC)} <= {"sql", "sql admin"}


def test_every_example_runs_as_the_analyst(conn: psycopg.Connection[Any]) -> None:
    ids = seed(conn)
    admin = [body for info, body in sql_blocks(DOC) if info == "sql admin"]
    created: list[str] = []
    try:
        # What the guide asks an administrator to run works, and gives a working login.
        for body in admin:
            conn.execute(body)
            created += [w for w in body.split() if w.endswith("_analyst")][:1]
        for role in created:
            with conn.transaction():
                conn.execute(f'SET LOCAL ROLE "{role}"')
                seen = conn.execute("SELECT count(*) FROM sftq.analyst_jobs").fetchone()
                assert seen == (len(ids),)

        for info, body in sql_blocks(DOC):
            if info != "sql":
                continue
            conn.execute("SET ROLE sftq_analyst")
            try:
                cur = conn.execute(body)
                rows = cur.fetchall() if cur.description is not None else None
            except psycopg.Error as exc:
                pytest.fail(f"this example fails: {exc}\n{body}")
            finally:
                conn.execute("RESET ROLE")
            if rows is not None:
                assert rows, f"this example returns nothing on the test data:\n{body}"
                assert WANDB_SECRET not in json.dumps(rows, default=str)
    finally:
        conn.execute("RESET ROLE")
        for role in created:
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')
