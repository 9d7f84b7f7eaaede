"""`sftq admin ...` as a user runs it: a real process against a real database."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import clean_env, free_port, run_sftq

from sftq_server.dev.pgcluster import LocalCluster

KEY = re.compile(r"sftq_[0-9a-f]{48}")


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return clean_env(DATABASE_URL=db_url)


def admin(env: dict[str, str], *args: str) -> Any:
    return run_sftq("admin", *args, env=env)


def key_works(db_url: str, key: str) -> bool:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT sftq.authenticate(%s) IS NOT NULL", (hashlib.sha256(key.encode()).digest(),)
        ).fetchone()
    assert row is not None
    return bool(row[0])


def users(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    r = admin(env, "list-users", "--json")
    assert r.returncode == 0, r.stderr
    return {u["name"]: u for u in json.loads(r.stdout)}


def test_create_user(env: dict[str, str]) -> None:
    r = admin(env, "create-user", "alice")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "created user alice (cap 1)"
    assert "issue-key alice" in r.stderr

    r = admin(env, "create-user", "alice")
    assert (r.returncode, r.stdout) == (5, "")
    assert r.stderr.strip() == "error: user alice already exists"

    r = admin(env, "create-user", "bob", "--cap", "3")
    assert r.returncode == 0, r.stderr
    assert users(env)["bob"]["cap"] == 3

    r = admin(env, "create-user", "not a name")
    assert r.returncode == 7
    assert r.stderr.startswith("error: user name must be")
    assert "not a name" not in users(env)


def test_issue_key_prints_only_the_key(env: dict[str, str], db_url: str) -> None:
    assert admin(env, "create-user", "carol").returncode == 0
    r = admin(env, "issue-key", "carol")
    assert r.returncode == 0, r.stderr
    # Exactly the key and a newline, so `KEY=$(sftq admin issue-key carol)` captures it whole.
    assert KEY.fullmatch(r.stdout.rstrip("\n")) and r.stdout.count("\n") == 1, r.stdout
    key = r.stdout.strip()
    assert "only time" in r.stderr and key not in r.stderr and key[:13] in r.stderr
    assert key_works(db_url, key)
    assert users(env)["carol"]["active_keys"] == 1

    # A second key is a different key; both work.
    second = admin(env, "issue-key", "carol").stdout.strip()
    assert KEY.fullmatch(second) and second != key and key_works(db_url, second)

    r = admin(env, "issue-key", "nobody")
    assert (r.returncode, r.stdout) == (4, "")
    assert r.stderr.strip() == "error: user nobody not found"


def test_revoke_key(env: dict[str, str], db_url: str) -> None:
    assert admin(env, "create-user", "dave").returncode == 0
    key = admin(env, "issue-key", "dave").stdout.strip()
    r = admin(env, "revoke-key", key[:13])
    assert r.returncode == 0, r.stderr
    assert key[:13] in r.stdout
    assert not key_works(db_url, key)
    assert users(env)["dave"]["active_keys"] == 0

    r = admin(env, "revoke-key", key[:13])
    assert r.returncode == 4
    assert "no active key starts with" in r.stderr

    r = admin(env, "revoke-key", "sftq_")
    assert r.returncode == 7
    assert "at least the first 9 characters" in r.stderr


def test_revoke_key_refuses_an_ambiguous_prefix(env: dict[str, str], db_url: str) -> None:
    assert admin(env, "create-user", "erin").returncode == 0
    # Two keys that share their first 9 characters; random keys almost never do.
    with psycopg.connect(db_url, autocommit=True) as conn:
        for secret, prefix in (("one", "sftq_abcd1111"), ("two", "sftq_abcd2222")):
            conn.execute(
                "INSERT INTO sftq.api_keys (user_id, key_hash, prefix) "
                "SELECT id, %s, %s FROM sftq.users WHERE name = 'erin'",
                (hashlib.sha256(secret.encode()).digest(), prefix),
            )
    r = admin(env, "revoke-key", "sftq_abcd")
    assert r.returncode == 5
    assert "give a longer prefix" in r.stderr
    assert admin(env, "revoke-key", "sftq_abcd1").returncode == 0
    assert users(env)["erin"]["active_keys"] == 1


def test_set_cap(env: dict[str, str]) -> None:
    assert admin(env, "create-user", "frank").returncode == 0
    r = admin(env, "set-cap", "frank", "4")
    assert r.returncode == 0, r.stderr
    assert users(env)["frank"]["cap"] == 4

    assert admin(env, "set-cap", "nobody", "2").returncode == 4
    r = admin(env, "set-cap", "frank", "5000")
    assert r.returncode == 7
    assert "between 0 and 1000" in r.stderr
    assert admin(env, "set-cap", "frank", "many").returncode == 2
    assert users(env)["frank"]["cap"] == 4


def test_list_users_table_and_json(env: dict[str, str]) -> None:
    assert admin(env, "create-user", "gina", "--cap", "2").returncode == 0
    assert admin(env, "issue-key", "gina").returncode == 0
    r = admin(env, "list-users")
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split() == [
        "NAME",
        "CAP",
        "RUNNING",
        "QUEUED",
        "KEYS",
        "CREATED",
        "LAST",
        "USED",
        "DISABLED",
        "RPM",
        "MAX",
        "QUEUED",
        "STREAMS",
    ]
    gina = next(row.split() for row in rows if row.startswith("gina "))
    assert gina[:5] == ["gina", "2", "0", "0", "1"]

    listed = users(env)["gina"]
    assert listed["cap"] == 2 and listed["active_keys"] == 1 and listed["running"] == 0
    assert listed["created_at"].endswith("Z") and listed["disabled_at"] is None
    # Keys never appear, whole or hashed.
    assert "sftq_" not in json.dumps(listed)


def test_database_comes_from_flag_then_env_then_env_file(db_url: str, tmp_path: Path) -> None:
    bogus = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"

    # --database-url beats DATABASE_URL.
    r = run_sftq("admin", "list-users", "--database-url", db_url, env=clean_env(DATABASE_URL=bogus))
    assert r.returncode == 0, r.stderr

    # DATABASE_URL beats the env file.
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "env").write_text(f"DATABASE_URL={bogus}\n")
    r = run_sftq(
        "admin", "list-users", "--data-dir", str(data_dir), env=clean_env(DATABASE_URL=db_url)
    )
    assert r.returncode == 0, r.stderr

    # With neither, the env file of the dev stack (default .sftq in the current folder).
    (data_dir / "env").write_text(f"SUPABASE_URL=http://127.0.0.1:1\nDATABASE_URL={db_url}\n")
    assert run_sftq("admin", "list-users", "--data-dir", str(data_dir)).returncode == 0
    os.rename(data_dir, tmp_path / ".sftq")
    assert run_sftq("admin", "list-users", cwd=tmp_path).returncode == 0

    # And with nothing at all, a usage error that says what to do.
    r = run_sftq("admin", "list-users", cwd=tmp_path / ".sftq")
    assert r.returncode == 2
    assert "no database" in r.stderr and "sftq dev" in r.stderr


def test_unreachable_and_unmigrated_databases(pg_cluster: LocalCluster) -> None:
    bogus = f"postgresql://postgres:hunter2@127.0.0.1:{free_port()}/nothing"
    r = run_sftq("admin", "list-users", env=clean_env(DATABASE_URL=bogus))
    assert r.returncode == 6
    assert "cannot reach the database" in r.stderr
    assert "hunter2" not in r.stderr, "the password must not be printed"

    name = f"e2e_empty_{os.getpid()}"
    with psycopg.connect(pg_cluster.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        r = run_sftq("admin", "list-users", env=clean_env(DATABASE_URL=pg_cluster.url_for(name)))
        assert r.returncode == 1
        assert "sftq db migrate" in r.stderr
    finally:
        with psycopg.connect(pg_cluster.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_disable_and_enable_user(env: dict[str, str], db_url: str, stacks: Any) -> None:
    # The help says what happens to the user's jobs.
    help_text = admin(env, "disable-user", "--help").stdout
    flat = " ".join(help_text.split())
    assert (
        "401" in flat and "QUEUED jobs stay queued" in flat and "PROGRESS jobs keep running" in flat
    )

    dev = stacks.start(database_url=db_url)
    values = dev.wait_ready()
    base = f"{values['SUPABASE_URL']}/functions/v1"
    http = httpx.Client(timeout=30)

    def as_user(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def submit(key: str) -> str:
        r = http.post(
            f"{base}/jobs-api/jobs",
            headers=as_user(key),
            json={"kind": "SFT", "fireworks_payload": {"dataset": "d"}},
        )
        assert r.status_code == 201, r.text
        job_id: str = r.json()["id"]
        return job_id

    def tick() -> None:
        r = http.post(f"{base}/scheduler-tick", headers=as_user(values["SFTQ_TICK_SECRET"]))
        assert r.status_code == 200, r.text

    def state(job_id: str) -> str:
        with psycopg.connect(db_url) as conn:
            row = conn.execute("SELECT state FROM sftq.jobs WHERE id = %s", (job_id,)).fetchone()
        assert row is not None
        return str(row[0])

    try:
        assert admin(env, "create-user", "hana").returncode == 0
        assert admin(env, "create-user", "ivan").returncode == 0
        hana = admin(env, "issue-key", "hana").stdout.strip()
        ivan = admin(env, "issue-key", "ivan").stdout.strip()
        running, waiting = submit(hana), submit(hana)
        tick()
        assert (state(running), state(waiting)) == ("PROGRESS", "QUEUED")

        r = admin(env, "disable-user", "hana")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("disabled hana") and "1 queued, 1 running" in r.stdout
        assert users(env)["hana"]["disabled_at"] is not None
        again = admin(env, "disable-user", "hana")
        assert again.returncode == 0 and "already disabled" in again.stdout

        # Every route answers 401 to the disabled user's key.
        for method, path in (
            ("GET", "/jobs-api/jobs"),
            ("POST", "/jobs-api/jobs"),
            ("GET", f"/jobs-api/jobs/{waiting}"),
            ("DELETE", f"/jobs-api/jobs/{waiting}"),
            ("GET", f"/jobs-api/jobs/{waiting}/analytics"),
            ("GET", "/jobs-api/jobs/analytics/queue"),
            ("GET", "/jobs-api/jobs/analytics/summary"),
            ("GET", "/analytics/jobs/analytics/summary"),
        ):
            resp = http.request(
                method,
                base + path,
                headers=as_user(hana),
                json={"kind": "SFT", "fireworks_payload": {"dataset": "d"}},
            )
            assert resp.status_code == 401, (method, path, resp.text)

        # The queued job waits without holding up a later job of someone else; the running
        # one runs to its end, recorded as usual.
        later = submit(ivan)
        sim = f"{values['SIMULATOR_URL']}/_sim/jobs"
        with psycopg.connect(db_url) as conn:
            row = conn.execute(
                "SELECT fireworks_job_name FROM sftq.jobs WHERE id = %s", (running,)
            ).fetchone()
        assert row is not None
        finish = http.post(
            f"{sim}/{row[0].split('/', 2)[2]}:finish", json={"state": "JOB_STATE_COMPLETED"}
        )
        assert finish.status_code == 200, finish.text
        tick()
        assert (state(running), state(waiting), state(later)) == ("SUCCESS", "QUEUED", "PROGRESS")

        r = admin(env, "enable-user", "hana")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("enabled hana") and "1 queued, 0 running" in r.stdout
        assert http.get(f"{base}/jobs-api/jobs", headers=as_user(hana)).status_code == 200
        tick()
        assert state(waiting) == "PROGRESS"

        for command in ("disable-user", "enable-user"):
            r = admin(env, command, "nobody")
            assert (r.returncode, r.stderr.strip()) == (4, "error: user nobody not found")
    finally:
        http.close()
