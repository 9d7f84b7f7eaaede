"""cron/*.sql against a real PostgreSQL: psql runs the files as an operator would, with the
tick secret on its standard input.

The stock pg_cron 1.4 variant runs against the real extension (the test cluster preloads
pg_cron with cron.database_name = 'sftq_cron' when pg_cron.so is installed). pg_net and
Supabase Vault do not exist here, so each test installs stand-ins with their signatures: a
vault.secrets table and view, and pg_net's own tables (net.http_request_queue,
net._http_response) and net.http_post, with the grants pg_net's scripts and Supabase make
(everything on the tables to PUBLIC, the function to anon and authenticated). The Supabase
variant ('30 seconds') needs pg_cron >= 1.5: against an older real pg_cron the test checks
that it is refused and leaves nothing behind, and its job row is checked against a stand-in
cron schema instead (upsert by name, like pg_cron's own). Each scheduled command is then
executed as pg_cron would, to check the URL and the short-lived token it builds from Vault.
The webhook deliveries' job and poke (cron/schedule_webhooks.sql) are held to the same rules:
the secret on stdin, tokens only (checked by the functions' own bearer_ok), pg_net closed.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sftq_server.db import migrate as migrate
from sftq_server.dev.pgcluster import LocalCluster
from sftq_server.scheduler.http import bearer_ok

Conn = psycopg.Connection[Any]
CRON = Path(__file__).resolve().parents[2] / "cron"
CRON_DB = "sftq_cron"
URL = "https://example-ref.supabase.co/functions/v1/scheduler-tick"
DELIVER_URL = "https://example-ref.supabase.co/functions/v1/webhook-deliver"
SECRET = "cron-test-secret-4f9a7c2e1b8d-0123456789"
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
CREATE UNLOGGED TABLE net.http_request_queue (id bigserial, method text NOT NULL, url text NOT NULL,
                                              headers jsonb, body bytea,
                                              timeout_milliseconds int NOT NULL);
CREATE UNLOGGED TABLE net._http_response (id bigint, status_code integer, content_type text,
                                          headers jsonb, content text, timed_out bool,
                                          error_msg text,
                                          created timestamptz NOT NULL DEFAULT now());
CREATE FUNCTION net.http_post(url text, body jsonb DEFAULT '{}'::jsonb,
                              params jsonb DEFAULT '{}'::jsonb,
                              headers jsonb DEFAULT '{"Content-Type": "application/json"}'::jsonb,
                              timeout_milliseconds integer DEFAULT 5000)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO net.http_request_queue (method, url, headers, body, timeout_milliseconds)
    VALUES ('POST', url, headers, convert_to(body::text, 'UTF8'), timeout_milliseconds)
    RETURNING id $$;
-- What pg_net's install and upgrade scripts grant, and what Supabase adds for its API roles.
GRANT USAGE ON SCHEMA net TO PUBLIC;
GRANT ALL ON ALL SEQUENCES IN SCHEMA net TO PUBLIC;
GRANT ALL ON ALL TABLES IN SCHEMA net TO PUBLIC;
GRANT USAGE ON SCHEMA net TO anon, authenticated;
GRANT EXECUTE ON FUNCTION net.http_post(text, jsonb, jsonb, jsonb, integer) TO anon, authenticated;
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


# Cluster-wide roles the lockdown is checked against: Supabase's Data API roles, and a login
# role of the project's own (any database user must not read the queued request).
PROBE_LOGIN = "sftq_test_probe_login"
ROLES = f"""
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'anon') THEN
        CREATE ROLE anon NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'authenticated') THEN
        CREATE ROLE authenticated NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{PROBE_LOGIN}') THEN
        CREATE ROLE {PROBE_LOGIN} LOGIN;
    END IF;
END $$;
"""


def install_standins(conn: Conn, *, pgcrypto_schema: str) -> None:
    conn.execute(ROLES)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {pgcrypto_schema}")
    conn.execute(f"CREATE EXTENSION IF NOT EXISTS pgcrypto SCHEMA {pgcrypto_schema}")
    conn.execute(STANDINS)


def psql(url: str, script: str, *, secret: str | None = SECRET,
         **variables: str) -> subprocess.CompletedProcess[str]:
    """Run a cron script as the docs say: the secret on standard input, never on argv."""
    assert PSQL is not None
    args = [PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(CRON / script)]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    return subprocess.run(args, input=secret or "", capture_output=True, text=True, timeout=60,
                          check=False)


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
    """Run a scheduled command as pg_cron would, and return what it queued for pg_net."""
    conn.execute(command)
    row = conn.execute("SELECT url, headers, convert_from(body, 'UTF8')::jsonb, "
                       "timeout_milliseconds FROM net.http_request_queue "
                       "ORDER BY id DESC LIMIT 1").fetchone()
    assert row is not None
    return row[0], row[1], row[2], row[3]


TOKEN = re.compile(r"Bearer v1\.([0-9]+)\.([0-9a-f]{64})")


def check_command(conn: Conn, command: str, secret: str = SECRET, target: str = URL) -> None:
    # The secret and URL live in Vault, never in cron.job, whose command anyone with
    # access to the cron schema (and its run log) can read.
    assert secret not in command and target not in command
    before = time.time()
    url, headers, body, timeout = fire(conn, command)
    assert url == target
    assert set(headers) == {"Content-Type", "Authorization"}
    assert headers["Content-Type"] == "application/json"
    # Not the secret: a token of it that scheduler-tick accepts for two minutes.
    match = TOKEN.fullmatch(headers["Authorization"])
    assert match is not None, headers
    assert int(before) - 1 <= int(match[1]) <= time.time() + 1
    assert match[2] == hmac.new(secret.encode(), match[1].encode(), hashlib.sha256).hexdigest()
    # What the functions check (scheduler-tick and webhook-deliver alike) accepts it now.
    assert bearer_ok(headers["Authorization"].removeprefix("Bearer "), secret, time.time())
    queued = conn.execute("SELECT headers::text FROM net.http_request_queue").fetchall()
    assert not any(secret in row[0] for row in queued)
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
        install_standins(conn, pgcrypto_schema="public")
        try:
            yield url, conn
        finally:
            conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = ANY(%s)",
                         ([*JOBS, "sftq-scheduler-reconcile"],))
            conn.execute("DROP SCHEMA vault, net CASCADE")


@pytest.fixture
def standin_cron(db_url: str) -> Iterator[tuple[str, Conn]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        # pgcrypto where Supabase keeps it: the scripts must find it there.
        install_standins(conn, pgcrypto_schema="extensions")
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
        done = psql(url, "schedule_tick_pgcron14.sql", tick_url=URL)
        assert done.returncode == 0, done.stderr
        assert set(jobs(conn)) == {"sftq-scheduler-tick"}
    schedule, command = jobs(conn)["sftq-scheduler-tick"]
    assert schedule == "* * * * *"
    check_command(conn, command)
    assert secrets(conn) == {"sftq_tick_secret": [SECRET], "sftq_tick_url": [URL]}

    # The half-minute companion, then rotating the secret and dropping the companion again.
    done = psql(url, "schedule_tick_pgcron14.sql", tick_url=URL, half_minute="on")
    assert done.returncode == 0, done.stderr
    assert set(jobs(conn)) == set(JOBS)
    offset_schedule, offset_command = jobs(conn)["sftq-scheduler-tick-offset"]
    assert offset_schedule == "* * * * *" and "pg_sleep(30)" in offset_command
    check_command(conn, offset_command.replace("SELECT pg_sleep(30);", ""))
    rotated = SECRET + "-rotated"
    done = psql(url, "schedule_tick_pgcron14.sql", secret=rotated, tick_url=URL)
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
    done = psql(url, "schedule_tick.sql", tick_url=URL)
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
        done = psql(url, "schedule_tick.sql", tick_url=URL)
        assert done.returncode == 0, done.stderr
        assert set(jobs(conn)) == {"sftq-scheduler-tick"}
    schedule, command = jobs(conn)["sftq-scheduler-tick"]
    assert schedule == "30 seconds"
    check_command(conn, command)
    assert secrets(conn) == {"sftq_tick_secret": [SECRET], "sftq_tick_url": [URL]}

    done = psql(url, "schedule_tick.sql", tick_url=URL, tick_schedule="15 seconds")
    assert done.returncode == 0, done.stderr
    assert jobs(conn)["sftq-scheduler-tick"][0] == "15 seconds"

    done = psql(url, "unschedule_tick.sql")
    assert done.returncode == 0, done.stderr
    assert jobs(conn) == {}


@needs_psql
@pytest.mark.parametrize(("secret", "variables", "message"), [
    (SECRET, {}, "tick_url is not set"),
    (None, {"tick_url": URL}, "the tick secret is not set"),
    (SECRET, {"tick_url": "example.com/tick"}, "must be an http(s) URL"),
    ("short-but-not-32-characters", {"tick_url": URL}, "at least 32 characters"),
    # On the command line any local user could read it with ps: refused.
    (SECRET, {"tick_url": URL, "tick_secret": SECRET}, "not taken as a psql variable"),
])
@pytest.mark.parametrize("script", ["schedule_tick.sql", "schedule_tick_pgcron14.sql"])
def test_bad_input_changes_nothing(standin_cron: tuple[str, Conn], script: str,
                                   secret: str | None, variables: dict[str, str],
                                   message: str) -> None:
    url, conn = standin_cron
    done = psql(url, script, secret=secret, **variables)
    assert done.returncode != 0
    assert message in done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert jobs(conn) == {} and secrets(conn) == {}


@needs_psql
def test_pgcrypto_is_required(standin_cron: tuple[str, Conn]) -> None:
    url, conn = standin_cron
    conn.execute("DROP EXTENSION pgcrypto")
    done = psql(url, "schedule_tick.sql", tick_url=URL)
    assert done.returncode != 0 and "pgcrypto is not installed" in done.stderr
    assert jobs(conn) == {} and secrets(conn) == {}


# ---- pg_net's schema is closed to everyone but the job's owner ---------------------------

def can(conn: Conn, role: str, sql: str) -> bool:
    with conn.transaction():
        conn.execute(f"SET LOCAL ROLE {role}")
        try:
            with conn.transaction():
                conn.execute(sql)
            return True
        except psycopg.errors.InsufficientPrivilege:
            return False


PROBES = {
    "read the queued request": "SELECT headers FROM net.http_request_queue",
    "read the answers": "SELECT content FROM net._http_response",
    "queue a request": "INSERT INTO net.http_request_queue (method, url, timeout_milliseconds) "
                       "VALUES ('GET', 'http://169.254.169.254/', 1000)",
    "call http_post": "SELECT net.http_post('http://169.254.169.254/')",
}


def check_net(url: str) -> subprocess.CompletedProcess[str]:
    return psql(url, "check_net_private.sql", secret=None)


@needs_psql
def test_the_schedule_closes_pg_net_to_other_roles(standin_cron: tuple[str, Conn]) -> None:
    url, conn = standin_cron
    # As pg_net and Supabase leave it, every role can read the queue and send requests.
    for role in ("anon", "authenticated", PROBE_LOGIN):
        assert can(conn, role, PROBES["read the queued request"]), role
    refused = check_net(url)
    assert refused.returncode != 0 and "pg_net is open to roles other than" in refused.stderr
    assert f"{PROBE_LOGIN} can select net.http_request_queue" in refused.stderr

    done = psql(url, "schedule_tick.sql", tick_url=URL)
    assert done.returncode == 0, done.stderr
    for role in ("anon", "authenticated", PROBE_LOGIN):
        for what, sql in PROBES.items():
            assert not can(conn, role, sql), f"{role} can still {what}"
    acl = conn.execute("SELECT count(*) FROM pg_class c, aclexplode(c.relacl) a "
                       "WHERE c.relnamespace = 'net'::regnamespace AND a.grantee = 0").fetchone()
    assert acl == (0,)
    passed = check_net(url)
    assert passed.returncode == 0, passed.stderr
    # The job's owner still fires the tick.
    check_command(conn, jobs(conn)["sftq-scheduler-tick"][1])

    # A grant that comes back later (an extension upgrade, a hand-made one) is caught.
    conn.execute(f"GRANT SELECT ON net.http_request_queue TO {PROBE_LOGIN}")
    again = check_net(url)
    assert again.returncode != 0
    assert f"{PROBE_LOGIN} can select net.http_request_queue" in again.stderr


# ---- the webhook deliveries' job and poke, hardened like the tick's ------------------------

def webhook_jobs(conn: Conn) -> dict[str, tuple[str, str]]:
    rows = conn.execute("SELECT jobname, schedule, command FROM cron.job "
                        "WHERE jobname = 'sftq-webhooks-deliver'").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


# The poke as schedule_webhooks.sql leaves it: in the cron wiring's own schema, owned by
# the jobs' owner (the test cluster's postgres, as on Supabase), SECURITY DEFINER with a
# fixed search_path and no arguments.
POKE = ("sftq_cron._webhook_poke()", True, "postgres", ["search_path=pg_catalog, pg_temp"], 0)


def pokes(conn: Conn) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(
        "SELECT p.oid::regprocedure::text, p.prosecdef, pg_get_userbyid(p.proowner), "
        "p.proconfig, p.pronargs FROM pg_proc p WHERE p.proname = '_webhook_poke' "
        "ORDER BY 1").fetchall()]


def poke_trigger(conn: Conn) -> str | None:
    row = conn.execute("SELECT tgfoid::regprocedure::text FROM pg_trigger "
                       "WHERE tgrelid = 'sftq.webhook_deliveries'::regclass "
                       "AND tgname = 'webhook_deliveries_poke'").fetchone()
    return None if row is None else str(row[0])


def definer_owners(conn: Conn) -> list[str]:
    """Who owns the SECURITY DEFINER functions of sftq: item 3 says sftq_definer alone."""
    return [r[0] for r in conn.execute(
        "SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc "
        "WHERE pronamespace = 'sftq'::regnamespace AND prosecdef ORDER BY 1").fetchall()]


def migrate_again(conn: Conn, url: str) -> None:
    """A later `sftq db migrate` that applies something (every procedure, as if an upgrade
    changed them), so that the grants, with their handover of SECURITY DEFINER functions to
    sftq_definer, run again after it."""
    conn.execute("UPDATE sftq_migrations.applied SET checksum = 'changed' "
                 "WHERE name LIKE 'procedures/%'")
    assert "grants/090_security.sql" in migrate.migrate(url)


def hooked_user(conn: Conn) -> int:
    row = conn.execute("SELECT sftq.create_user('hooked')").fetchone()
    assert row is not None
    conn.execute("SELECT sftq.webhook_create(%s, gen_random_uuid(), 'https://hooks.example.com/',"
                 " ARRAY['job.*'], NULL, 'v0:x')", (row[0],))
    return int(row[0])


@needs_psql
def test_the_webhook_job_and_poke_send_tokens_and_keep_pg_net_closed(
        standin_cron: tuple[str, Conn]) -> None:
    url, conn = standin_cron
    # As deploy.sh runs them: the tick, the webhooks (the same secret on stdin), the check.
    assert psql(url, "schedule_tick.sql", tick_url=URL).returncode == 0
    for _ in range(2):  # a second run replaces, never adds
        done = psql(url, "schedule_webhooks.sql", deliver_url=DELIVER_URL)
        assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert secrets(conn) == {"sftq_tick_secret": [SECRET], "sftq_tick_url": [URL]}
    stored = conn.execute("SELECT decrypted_secret FROM vault.decrypted_secrets "
                          "WHERE name = 'sftq_webhooks_url'").fetchall()
    assert stored == [(DELIVER_URL,)]
    passed = check_net(url)
    assert passed.returncode == 0, passed.stderr
    for role in ("anon", "authenticated", PROBE_LOGIN):
        for what, sql in PROBES.items():
            assert not can(conn, role, sql), f"{role} can still {what}"

    # The job: nothing due, nothing sent; then a token, never the secret, to the deliver URL.
    (schedule, command), = webhook_jobs(conn).values()
    assert schedule == "5 seconds"
    conn.execute(command)
    assert conn.execute("SELECT count(*) FROM net.http_request_queue").fetchone() == (0,)
    uid = hooked_user(conn)
    # The poke: the transaction that wrote the delivery queued one request with a token (and,
    # being a submit, one admission wake-up to the tick: tests below).
    conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid,))
    poke = conn.execute("SELECT url, headers FROM net.http_request_queue "
                        "WHERE url <> %s", (URL,)).fetchall()
    assert len(poke) == 1 and poke[0][0] == DELIVER_URL
    assert conn.execute("SELECT count(*) FROM net.http_request_queue WHERE url = %s",
                        (URL,)).fetchone() == (1,)
    match = TOKEN.fullmatch(poke[0][1]["Authorization"])
    assert match is not None, poke
    assert bearer_ok(poke[0][1]["Authorization"].removeprefix("Bearer "), SECRET, time.time())
    check_command(conn, command, target=DELIVER_URL)
    # The poke runs as its owner, the jobs' owner (SECURITY DEFINER), for any writer of
    # deliveries, which cannot reach pg_net itself; it lives outside sftq (see below).
    assert pokes(conn) == [POKE]

    # A secret rotated through the webhooks script is the tick's too (one Vault entry).
    rotated = SECRET + "-rotated"
    assert psql(url, "schedule_webhooks.sql", secret=rotated,
                deliver_url=DELIVER_URL).returncode == 0
    assert secrets(conn)["sftq_tick_secret"] == [rotated]
    check_command(conn, jobs(conn)["sftq-scheduler-tick"][1], rotated)
    check_command(conn, command, rotated, target=DELIVER_URL)

    # Unscheduling leaves pg_net closed and the check passing.
    for script in ("unschedule_webhooks.sql", "unschedule_tick.sql"):
        done = psql(url, script, secret=None)
        assert done.returncode == 0, done.stderr
    assert webhook_jobs(conn) == {} and jobs(conn) == {}
    assert pokes(conn) == [] and poke_trigger(conn) is None
    assert conn.execute("SELECT to_regnamespace('sftq_cron')").fetchone() == (None,)
    assert check_net(url).returncode == 0


def api_enqueue_as_sftq_api(conn: Conn, user: str) -> None:
    """A job through the API's own path: sftq_api calls api_enqueue, which writes the event
    and its deliveries as sftq_definer. Neither role has any right on pg_net or sftq_cron."""
    row = conn.execute("SELECT key FROM sftq.issue_key(%s)", (user,)).fetchone()
    assert row is not None
    digest = hashlib.sha256(row[0].encode()).digest()
    with conn.transaction():
        conn.execute("SET LOCAL ROLE sftq_api")
        conn.execute("SELECT body FROM sftq.api_enqueue(%s, 'SFT', '{}'::jsonb, NULL, 4, NULL)",
                     (digest,))


def queued_pokes(conn: Conn) -> list[tuple[str, str]]:
    """The webhook pokes queued (not the admission wake-ups to the tick, tested below)."""
    return [(r[0], r[1]["Authorization"]) for r in conn.execute(
        "SELECT url, headers FROM net.http_request_queue WHERE url <> %s ORDER BY id",
        (URL,)).fetchall()]


@needs_psql
def test_the_poke_keeps_working_after_any_number_of_migrates(
        standin_cron: tuple[str, Conn]) -> None:
    """The grants hand every SECURITY DEFINER function of sftq to sftq_definer, which has no
    pg_net and no Vault, on every migrate that applies something. The poke lives outside sftq
    (schema sftq_cron, the jobs' owner's): migrates never touch it, item 3 holds for all of
    sftq, and the poke still sends its token after them."""
    url, conn = standin_cron
    assert psql(url, "schedule_tick.sql", tick_url=URL).returncode == 0
    done = psql(url, "schedule_webhooks.sql", deliver_url=DELIVER_URL)
    assert done.returncode == 0, done.stderr
    hooked_user(conn)
    for _ in range(2):
        migrate_again(conn, url)
        assert pokes(conn) == [POKE]
        assert poke_trigger(conn) == "sftq_cron._webhook_poke()"
        assert definer_owners(conn) == ["sftq_definer"]
        passed = check_net(url)
        assert passed.returncode == 0, passed.stderr

        conn.execute("DELETE FROM net.http_request_queue")
        api_enqueue_as_sftq_api(conn, "hooked")
        (target, authorization), = queued_pokes(conn)
        assert target == DELIVER_URL
        assert bearer_ok(authorization.removeprefix("Bearer "), SECRET, time.time())

    # Nobody else can use the poke's schema or the poke: a trigger needs neither from the
    # writers that fire it, and with both a role could hang the poke on a table of its own.
    for role in ("anon", "authenticated", PROBE_LOGIN, "sftq_api", "sftq_definer",
                 "sftq_scheduler", "public"):
        assert conn.execute("SELECT has_schema_privilege(%s, 'sftq_cron', 'USAGE'), "
                            "has_function_privilege(%s, 'sftq_cron._webhook_poke()', 'EXECUTE')",
                            (role, role)).fetchone() == (False, False), role
    conn.execute(f"GRANT USAGE ON SCHEMA sftq_cron TO {PROBE_LOGIN}")
    conn.execute(f"GRANT EXECUTE ON FUNCTION sftq_cron._webhook_poke() TO {PROBE_LOGIN}")
    refused = check_net(url)
    assert refused.returncode != 0
    assert f"{PROBE_LOGIN} can use schema sftq_cron" in refused.stderr
    assert f"{PROBE_LOGIN} can execute sftq_cron._webhook_poke()" in refused.stderr
    # Running the script again takes those rights back.
    assert psql(url, "schedule_webhooks.sql", deliver_url=DELIVER_URL).returncode == 0
    conn.execute(f"REVOKE USAGE ON SCHEMA sftq_cron FROM {PROBE_LOGIN}")
    passed = check_net(url)
    assert passed.returncode == 0, passed.stderr


@needs_psql
def test_the_poke_as_a_non_superuser_like_supabases_postgres(pg_cluster: LocalCluster) -> None:
    """On Supabase one role, postgres, migrates and schedules, and it is no superuser: what
    keeps the poke working is its own rights, not a superuser's. The same role migrates,
    runs the cron scripts (pg_net's and Vault's stand-ins are its own, so it may revoke on
    them) and migrates again; the poke stays its own and keeps sending."""
    owner, db = "t_cron_owner", "t_cron_nonsuper"
    with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {owner} LOGIN CREATEROLE")
        admin.execute(f"CREATE DATABASE {db} OWNER {owner}")
    url = f"postgresql://{owner}@127.0.0.1:{pg_cluster.port}/{db}"
    try:
        migrate.migrate(url)
        with psycopg.connect(url, autocommit=True) as conn, \
                psycopg.connect(pg_cluster.url_for(db), autocommit=True) as su:
            install_standins(conn, pgcrypto_schema="extensions")
            conn.execute(CRON_STANDIN)
            assert psql(url, "schedule_tick.sql", tick_url=URL).returncode == 0
            done = psql(url, "schedule_webhooks.sql", deliver_url=DELIVER_URL)
            assert done.returncode == 0, done.stderr
            hooked_user(conn)
            migrate_again(conn, url)
            assert pokes(conn) == [(POKE[0], True, owner, *POKE[3:])]
            assert definer_owners(conn) == ["sftq_definer"]
            passed = check_net(url)
            assert passed.returncode == 0, passed.stderr
            api_enqueue_as_sftq_api(su, "hooked")
            (target, authorization), = queued_pokes(conn)
            assert target == DELIVER_URL
            assert bearer_ok(authorization.removeprefix("Bearer "), SECRET, time.time())
            for script in ("unschedule_webhooks.sql", "unschedule_tick.sql"):
                done = psql(url, script, secret=None)
                assert done.returncode == 0, done.stderr
            assert pokes(conn) == []
    finally:
        with psycopg.connect(pg_cluster.url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {db}")
            admin.execute(f"REVOKE sftq_definer FROM {owner}")
            admin.execute(f"DROP ROLE IF EXISTS {owner}")


# What an older cron/schedule_webhooks.sql made: the poke in schema sftq (its real body minted
# a token; this stand-in sends a fixed header, enough to show whether it can send at all).
OLD_POKE = """
CREATE FUNCTION sftq._webhook_poke() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    BEGIN
        PERFORM net.http_post(
            url := (SELECT decrypted_secret FROM vault.decrypted_secrets
                     WHERE name = 'sftq_tick_url'),
            headers := jsonb_build_object('Authorization', 'Bearer old'));
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'sftq: webhook poke not sent (%); the cron job will deliver', SQLERRM;
    END;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION sftq._webhook_poke() FROM PUBLIC;
CREATE TRIGGER webhook_deliveries_poke AFTER INSERT ON sftq.webhook_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION sftq._webhook_poke();
"""


@needs_psql
def test_a_poke_left_in_sftq_is_caught_and_moved(standin_cron: tuple[str, Conn]) -> None:
    """A database set up by the older script: the next migrate hands its poke to
    sftq_definer and the poke goes silent. The check names it and the fix; running
    schedule_webhooks.sql again moves the poke out of sftq, and the check passes."""
    url, conn = standin_cron
    assert psql(url, "schedule_tick.sql", tick_url=URL).returncode == 0
    conn.execute(OLD_POKE)
    uid = hooked_user(conn)
    migrate_again(conn, url)
    assert pokes(conn) == [("sftq._webhook_poke()", True, "sftq_definer",
                            ["search_path=pg_catalog, pg_temp"], 0)]
    conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid,))
    assert queued_pokes(conn) == []  # sftq_definer can reach neither Vault nor pg_net
    refused = check_net(url)
    assert refused.returncode != 0
    assert "sftq._webhook_poke() is left from an older cron/schedule_webhooks.sql" in refused.stderr
    assert "Run cron/schedule_webhooks.sql again" in refused.stderr

    done = psql(url, "schedule_webhooks.sql", deliver_url=DELIVER_URL)
    assert done.returncode == 0, done.stderr
    assert pokes(conn) == [POKE] and poke_trigger(conn) == "sftq_cron._webhook_poke()"
    passed = check_net(url)
    assert passed.returncode == 0, passed.stderr
    migrate_again(conn, url)
    api_enqueue_as_sftq_api(conn, "hooked")
    (target, authorization), = queued_pokes(conn)
    assert target == DELIVER_URL and authorization != "Bearer old"
    assert bearer_ok(authorization.removeprefix("Bearer "), SECRET, time.time())

    # The old poke left with poke=off, or by the unschedule script, goes as well.
    conn.execute("DROP TRIGGER webhook_deliveries_poke ON sftq.webhook_deliveries")
    conn.execute(OLD_POKE)
    assert psql(url, "unschedule_webhooks.sql", secret=None).returncode == 0
    assert pokes(conn) == [] and poke_trigger(conn) is None
    conn.execute(OLD_POKE)
    done = psql(url, "schedule_webhooks.sql", deliver_url=DELIVER_URL, poke="off")
    assert done.returncode == 0, done.stderr
    assert pokes(conn) == [POKE] and poke_trigger(conn) is None


@needs_psql
def test_the_check_catches_a_request_owner_locked_out(standin_cron: tuple[str, Conn]) -> None:
    """Scheduling the webhooks as another role than the tick would revoke the tick's owner
    from pg_net (each script keeps it to the role running it): the check says so."""
    url, conn = standin_cron
    assert psql(url, "schedule_tick.sql", tick_url=URL).returncode == 0
    conn.execute(f"UPDATE cron.job SET username = '{PROBE_LOGIN}' "
                 "WHERE jobname = 'sftq-scheduler-tick'")
    refused = check_net(url)
    assert refused.returncode != 0
    assert f"{PROBE_LOGIN} of the queue's requests can no longer queue" in refused.stderr


@needs_psql
def test_the_webhooks_script_on_real_pg_cron(real_cron: tuple[str, Conn]) -> None:
    """The webhooks job on the real pg_cron 1.4 (minute schedule), in a database without
    the queue's schema: the script fails as a whole and leaves no job, secret or trigger."""
    url, conn = real_cron
    done = psql(url, "schedule_webhooks.sql", deliver_url=DELIVER_URL,
                deliver_schedule="* * * * *")
    assert done.returncode != 0 and "sftq.webhook_deliveries" in done.stderr
    assert webhook_jobs(conn) == {} and secrets(conn) == {}
    assert conn.execute("SELECT to_regnamespace('sftq_cron')").fetchone() == (None,)


# ---- the admission wake-up and the reconcile job (issue 53) -------------------------------

def tick_requests(conn: Conn) -> list[tuple[Any, str]]:
    """What was queued for scheduler-tick: (body, Authorization)."""
    return [(r[0], r[1]["Authorization"]) for r in conn.execute(
        "SELECT convert_from(body, 'UTF8')::jsonb, headers FROM net.http_request_queue "
        "WHERE url = %s ORDER BY id", (URL,)).fetchall()]


def wake_trigger(conn: Conn) -> str | None:
    row = conn.execute("SELECT tgfoid::regprocedure::text FROM pg_trigger "
                       "WHERE tgrelid = 'sftq.admission_wake'::regclass "
                       "AND tgname = 'admission_wake_poke'").fetchone()
    return None if row is None else str(row[0])


def reconcile_job(conn: Conn) -> tuple[str, str] | None:
    row = conn.execute("SELECT schedule, command FROM cron.job "
                       "WHERE jobname = 'sftq-scheduler-reconcile'").fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


@needs_psql
@pytest.mark.parametrize("script", ["schedule_tick.sql", "schedule_tick_pgcron14.sql"])
def test_a_submit_pokes_the_tick_once_until_a_tick_takes_the_wake(
        standin_cron: tuple[str, Conn], script: str) -> None:
    url, conn = standin_cron
    done = psql(url, script, tick_url=URL)
    assert done.returncode == 0, done.stderr
    assert wake_trigger(conn) == "sftq_cron._tick_poke()"
    uid = conn.execute("SELECT sftq.create_user('ann')").fetchone()
    assert uid is not None
    conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid[0],))
    (body, authorization), = tick_requests(conn)
    assert body == {"wake": True}
    assert TOKEN.fullmatch(authorization) is not None
    assert bearer_ok(authorization.removeprefix("Bearer "), SECRET, time.time())
    # The wake is pending: a burst of submits sends nothing more.
    for _ in range(5):
        conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid[0],))
    assert len(tick_requests(conn)) == 1
    # A tick takes it; a submit during the tick pokes (the POST will find the lease taken),
    # and the tick's end pokes again, once, so that wake is not lost.
    tick = conn.execute("SELECT sftq.tick_begin('t')").fetchone()
    assert tick is not None
    conn.execute("SELECT sftq.admission_wake_take()")
    conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid[0],))
    assert len(tick_requests(conn)) == 2
    conn.execute("SELECT sftq.tick_finish(%s, '{}'::jsonb)", (tick[0],))
    assert [b for b, _ in tick_requests(conn)] == [{"wake": True}] * 3
    passed = check_net(url)
    assert passed.returncode == 0, passed.stderr

    # wake=off takes the trigger away; the periodic job stays.
    done = psql(url, script, tick_url=URL, wake="off")
    assert done.returncode == 0, done.stderr
    assert wake_trigger(conn) is None and "sftq-scheduler-tick" in jobs(conn)
    conn.execute("SELECT sftq.admission_wake_take()")
    conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid[0],))
    assert len(tick_requests(conn)) == 3

    done = psql(url, "unschedule_tick.sql", secret=None)
    assert done.returncode == 0, done.stderr
    assert conn.execute("SELECT to_regprocedure('sftq_cron._tick_poke()')").fetchone() == (None,)
    assert conn.execute("SELECT to_regnamespace('sftq_cron')").fetchone() == (None,)


@needs_psql
def test_the_wake_up_survives_migrates_and_stays_closed(standin_cron: tuple[str, Conn]) -> None:
    url, conn = standin_cron
    assert psql(url, "schedule_tick.sql", tick_url=URL).returncode == 0
    assert psql(url, "schedule_webhooks.sql", deliver_url=DELIVER_URL).returncode == 0
    hooked_user(conn)
    for _ in range(2):
        migrate_again(conn, url)
        assert wake_trigger(conn) == "sftq_cron._tick_poke()"
        assert definer_owners(conn) == ["sftq_definer"]
        passed = check_net(url)
        assert passed.returncode == 0, passed.stderr
        conn.execute("DELETE FROM net.http_request_queue")
        conn.execute("SELECT sftq.admission_wake_take()")
        # Through the API's own path: sftq_api, whose functions run as sftq_definer; neither
        # reaches pg_net, the wake-up runs as the jobs' owner.
        api_enqueue_as_sftq_api(conn, "hooked")
        (body, authorization), = tick_requests(conn)
        assert body == {"wake": True}
        assert bearer_ok(authorization.removeprefix("Bearer "), SECRET, time.time())
    for role in ("anon", "authenticated", PROBE_LOGIN, "sftq_api", "sftq_definer",
                 "sftq_scheduler", "public"):
        assert conn.execute("SELECT has_function_privilege(%s, 'sftq_cron._tick_poke()', "
                            "'EXECUTE')", (role,)).fetchone() == (False,), role
    conn.execute(f"GRANT EXECUTE ON FUNCTION sftq_cron._tick_poke() TO {PROBE_LOGIN}")
    refused = check_net(url)
    assert refused.returncode != 0
    assert f"{PROBE_LOGIN} can execute sftq_cron._tick_poke()" in refused.stderr
    assert psql(url, "schedule_tick.sql", tick_url=URL).returncode == 0
    assert check_net(url).returncode == 0
    # The webhooks' unschedule leaves the schema to the wake-up, and the other way round.
    assert psql(url, "unschedule_webhooks.sql", secret=None).returncode == 0
    assert wake_trigger(conn) == "sftq_cron._tick_poke()"
    assert psql(url, "unschedule_tick.sql", secret=None).returncode == 0
    assert conn.execute("SELECT to_regnamespace('sftq_cron')").fetchone() == (None,)


@needs_psql
def test_the_reconcile_job_fires_only_while_jobs_run(standin_cron: tuple[str, Conn]) -> None:
    url, conn = standin_cron
    done = psql(url, "schedule_tick.sql", tick_url=URL)
    assert done.returncode == 0, done.stderr
    job = reconcile_job(conn)
    assert job is not None and job[0] == "10 seconds"
    assert SECRET not in job[1] and URL not in job[1]
    conn.execute(job[1])
    assert tick_requests(conn) == []  # nothing runs: no invocation
    uid = conn.execute("SELECT sftq.create_user('ann')").fetchone()
    assert uid is not None
    row = conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid[0],)).fetchone()
    assert row is not None
    conn.execute("SELECT sftq.admit(64)")
    conn.execute("SELECT sftq.record_submitted(id, 'accounts/a/supervisedFineTuningJobs/x', "
                 "'JOB_STATE_RUNNING', false) FROM sftq.jobs")
    conn.execute("DELETE FROM net.http_request_queue")
    conn.execute(job[1])
    (body, authorization), = tick_requests(conn)
    assert body == {"pass": "reconcile"}
    assert bearer_ok(authorization.removeprefix("Bearer "), SECRET, time.time())

    done = psql(url, "schedule_tick.sql", tick_url=URL, reconcile_schedule="20 seconds")
    assert done.returncode == 0, done.stderr
    assert reconcile_job(conn) == ("20 seconds", job[1])
    done = psql(url, "schedule_tick.sql", tick_url=URL, reconcile_schedule="off")
    assert done.returncode == 0, done.stderr
    assert reconcile_job(conn) is None
    assert psql(url, "schedule_tick.sql", tick_url=URL).returncode == 0
    assert psql(url, "unschedule_tick.sql", secret=None).returncode == 0
    assert reconcile_job(conn) is None
