"""cron/*.sql against a real PostgreSQL: psql runs the files as an operator would.

The stock pg_cron 1.4 variant runs against the real extension (the test cluster preloads
pg_cron with cron.database_name = 'sftq_cron' when pg_cron.so is installed). pg_net and
Supabase Vault do not exist here, so each test installs stand-ins with their signatures: a
vault.secrets table and view, and a net.http_post that records its arguments. The Supabase
variant ('30 seconds') needs pg_cron >= 1.5: against an older real pg_cron the test checks
that it is refused and leaves nothing behind, and its job row is checked against a stand-in
cron schema instead (upsert by name, like pg_cron's own). Each scheduled command is then
executed as pg_cron would, to check the URL and header it builds from Vault.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sftq_server.pgcluster import LocalCluster

Conn = psycopg.Connection[Any]
CRON = Path(__file__).resolve().parents[2] / "cron"
CRON_DB = "sftq_cron"
URL = "https://example-ref.supabase.co/functions/v1/scheduler-tick"
SECRET = "cron-test-secret-4f9a7c2e1b8d"
JOBS = ("sftq-scheduler-tick", "sftq-scheduler-tick-offset")

PSQL = shutil.which("psql")
needs_psql = pytest.mark.skipif(PSQL is None, reason="psql is not installed")

STANDINS = """
CREATE SCHEMA vault;
CREATE TABLE vault.secrets (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), name text UNIQUE,
                            description text NOT NULL DEFAULT '', secret text NOT NULL);
CREATE VIEW vault.decrypted_secrets AS
    SELECT id, name, description, secret, secret AS decrypted_secret FROM vault.secrets;
CREATE FUNCTION vault.create_secret(new_secret text, new_name text = NULL,
                                    new_description text = '', new_key_id uuid = NULL)
RETURNS uuid LANGUAGE sql AS $$
    INSERT INTO vault.secrets (secret, name, description)
    VALUES (new_secret, new_name, new_description) RETURNING id $$;
CREATE FUNCTION vault.update_secret(secret_id uuid, new_secret text = NULL, new_name text = NULL,
                                    new_description text = NULL, new_key_id uuid = NULL)
RETURNS void LANGUAGE sql AS $$
    UPDATE vault.secrets SET secret = coalesce(new_secret, secret), name = coalesce(new_name, name),
           description = coalesce(new_description, description) WHERE id = secret_id $$;
CREATE SCHEMA net;
CREATE TABLE net.calls (id bigserial PRIMARY KEY, url text, body jsonb, params jsonb,
                        headers jsonb, timeout_milliseconds integer);
CREATE FUNCTION net.http_post(url text, body jsonb DEFAULT '{}'::jsonb,
                              params jsonb DEFAULT '{}'::jsonb,
                              headers jsonb DEFAULT '{"Content-Type": "application/json"}'::jsonb,
                              timeout_milliseconds integer DEFAULT 5000)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO net.calls (url, body, params, headers, timeout_milliseconds)
    VALUES (url, body, params, headers, timeout_milliseconds) RETURNING id $$;
"""

CRON_STANDIN = """
CREATE SCHEMA cron;
CREATE TABLE cron.job (jobid bigserial PRIMARY KEY, schedule text NOT NULL, command text NOT NULL,
                       database text NOT NULL DEFAULT current_database(),
                       username text NOT NULL DEFAULT current_user,
                       active boolean NOT NULL DEFAULT true, jobname text UNIQUE);
CREATE FUNCTION cron.schedule(job_name text, schedule text, command text) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO cron.job (jobname, schedule, command) VALUES (job_name, schedule, command)
    ON CONFLICT (jobname) DO UPDATE SET schedule = EXCLUDED.schedule, command = EXCLUDED.command
    RETURNING jobid $$;
CREATE FUNCTION cron.unschedule(job_id bigint) RETURNS boolean LANGUAGE sql AS $$
    WITH d AS (DELETE FROM cron.job WHERE jobid = job_id RETURNING 1) SELECT EXISTS (SELECT FROM d)
$$;
"""


def psql(url: str, script: str, **variables: str) -> subprocess.CompletedProcess[str]:
    assert PSQL is not None
    args = [PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(CRON / script)]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def jobs(conn: Conn) -> dict[str, tuple[str, str]]:
    rows = conn.execute("SELECT jobname, schedule, command FROM cron.job WHERE jobname = ANY(%s)",
                        (list(JOBS),)).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def secrets(conn: Conn) -> dict[str, list[str]]:
    rows = conn.execute("SELECT name, decrypted_secret FROM vault.decrypted_secrets "
                        "WHERE name LIKE 'sftq_tick_%' ORDER BY name").fetchall()
    out: dict[str, list[str]] = {}
    for name, value in rows:
        out.setdefault(name, []).append(value)
    return out


def fire(conn: Conn, command: str) -> tuple[str, dict[str, Any], Any, int]:
    """Run a scheduled command as pg_cron would, and return what it asked pg_net to POST."""
    conn.execute(command)
    row = conn.execute("SELECT url, headers, body, timeout_milliseconds FROM net.calls "
                       "ORDER BY id DESC LIMIT 1").fetchone()
    assert row is not None
    return row[0], row[1], row[2], row[3]


def check_command(conn: Conn, command: str, secret: str = SECRET) -> None:
    # The secret and URL live in Vault, never in cron.job, whose command anyone with
    # access to the cron schema (and its run log) can read.
    assert SECRET not in command and URL not in command
    url, headers, body, timeout = fire(conn, command)
    assert url == URL
    assert headers == {"Content-Type": "application/json", "Authorization": f"Bearer {secret}"}
    assert body == {} and timeout == 25000


@pytest.fixture
def real_cron(pg_cluster: LocalCluster) -> Iterator[tuple[str, Conn]]:
    if not (pg_cluster.bindir.parent / "lib" / "pg_cron.so").exists():
        pytest.skip("pg_cron is not installed (Debian: postgresql-<version>-cron)")
    with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (CRON_DB,)).fetchone():
            admin.execute(f"CREATE DATABASE {CRON_DB}")
    url = pg_cluster.url_for(CRON_DB)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        conn.execute("DROP SCHEMA IF EXISTS vault, net CASCADE")
        conn.execute(STANDINS)
        try:
            yield url, conn
        finally:
            conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = ANY(%s)",
                         (list(JOBS),))
            conn.execute("DROP SCHEMA vault, net CASCADE")


@pytest.fixture
def standin_cron(db_url: str) -> Iterator[tuple[str, Conn]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(STANDINS)
        conn.execute(CRON_STANDIN)
        yield db_url, conn


def pg_cron_version(conn: Conn) -> tuple[int, ...]:
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'").fetchone()
    assert row is not None
    return tuple(int(p) for p in str(row[0]).replace("-", ".").split(".")[:2])


@needs_psql
def test_pgcron14_variant_on_real_pg_cron(real_cron: tuple[str, Conn]) -> None:
    url, conn = real_cron
    for _ in range(2):  # a second run replaces, never adds
        done = psql(url, "schedule_tick_pgcron14.sql", tick_url=URL, tick_secret=SECRET)
        assert done.returncode == 0, done.stderr
        assert set(jobs(conn)) == {"sftq-scheduler-tick"}
    schedule, command = jobs(conn)["sftq-scheduler-tick"]
    assert schedule == "* * * * *"
    check_command(conn, command)
    assert secrets(conn) == {"sftq_tick_secret": [SECRET], "sftq_tick_url": [URL]}

    # The half-minute companion, then rotating the secret and dropping the companion again.
    done = psql(url, "schedule_tick_pgcron14.sql", tick_url=URL, tick_secret=SECRET,
                half_minute="on")
    assert done.returncode == 0, done.stderr
    assert set(jobs(conn)) == set(JOBS)
    offset_schedule, offset_command = jobs(conn)["sftq-scheduler-tick-offset"]
    assert offset_schedule == "* * * * *" and "pg_sleep(30)" in offset_command
    rotated = SECRET + "-rotated"
    done = psql(url, "schedule_tick_pgcron14.sql", tick_url=URL, tick_secret=rotated)
    assert done.returncode == 0, done.stderr
    assert set(jobs(conn)) == {"sftq-scheduler-tick"}
    assert secrets(conn) == {"sftq_tick_secret": [rotated], "sftq_tick_url": [URL]}
    check_command(conn, jobs(conn)["sftq-scheduler-tick"][1], rotated)

    for _ in range(2):  # unscheduling twice is fine
        done = psql(url, "unschedule_tick.sql")
        assert done.returncode == 0, done.stderr
        assert jobs(conn) == {}


@needs_psql
def test_supabase_variant_on_real_pg_cron(real_cron: tuple[str, Conn]) -> None:
    url, conn = real_cron
    done = psql(url, "schedule_tick.sql", tick_url=URL, tick_secret=SECRET)
    if pg_cron_version(conn) >= (1, 5):
        assert done.returncode == 0, done.stderr
        assert jobs(conn)["sftq-scheduler-tick"][0] == "30 seconds"
        check_command(conn, jobs(conn)["sftq-scheduler-tick"][1])
        return
    # pg_cron 1.4 has no seconds schedules: the script fails as a whole, leaving nothing.
    assert done.returncode != 0
    assert "invalid schedule: 30 seconds" in done.stderr
    assert jobs(conn) == {} and secrets(conn) == {}


@needs_psql
def test_supabase_variant_structure(standin_cron: tuple[str, Conn]) -> None:
    url, conn = standin_cron
    for _ in range(2):
        done = psql(url, "schedule_tick.sql", tick_url=URL, tick_secret=SECRET)
        assert done.returncode == 0, done.stderr
        assert set(jobs(conn)) == {"sftq-scheduler-tick"}
    schedule, command = jobs(conn)["sftq-scheduler-tick"]
    assert schedule == "30 seconds"
    check_command(conn, command)
    assert secrets(conn) == {"sftq_tick_secret": [SECRET], "sftq_tick_url": [URL]}

    done = psql(url, "schedule_tick.sql", tick_url=URL, tick_secret=SECRET,
                tick_schedule="15 seconds")
    assert done.returncode == 0, done.stderr
    assert jobs(conn)["sftq-scheduler-tick"][0] == "15 seconds"

    done = psql(url, "unschedule_tick.sql")
    assert done.returncode == 0, done.stderr
    assert jobs(conn) == {}


@needs_psql
@pytest.mark.parametrize(("variables", "message"), [
    ({"tick_secret": SECRET}, "tick_url is not set"),
    ({"tick_url": URL}, "tick_secret is not set"),
    ({"tick_url": "example.com/tick", "tick_secret": SECRET}, "must be an http(s) URL"),
    ({"tick_url": URL, "tick_secret": "short"}, "at least 16 characters"),
])
@pytest.mark.parametrize("script", ["schedule_tick.sql", "schedule_tick_pgcron14.sql"])
def test_bad_variables_change_nothing(standin_cron: tuple[str, Conn], script: str,
                                      variables: dict[str, str], message: str) -> None:
    url, conn = standin_cron
    done = psql(url, script, **variables)
    assert done.returncode != 0
    assert message in done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert jobs(conn) == {} and secrets(conn) == {}
