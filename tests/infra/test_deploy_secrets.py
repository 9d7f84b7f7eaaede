"""Secrets stay out of statement text and command lines: `infra/deploy.sh db cron` for real,
against a private server that logs every statement (log_statement=all), with the real sftq
and psql behind wrappers that record each child's command line as the kernel shows it to
other users (/proc/<pid>/cmdline). Neither the server's log nor any command line may hold a
password or the tick secret; the logins made work with their passwords (scram-sha-256)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from infra_support import DEPLOY

from sftq_server.db import migrate as migrate
from sftq_server.dev.pgcluster import LocalCluster

OWNER_PASSWORD = "owner-Pass-0a1b2c3d4e"
API_PASSWORD = "api-Pass-9f8e7d6c5b4a3"
SCHEDULER_PASSWORD = "sched-Pass-1a2b3c4d5e6f"
ANALYST_PASSWORD = "analyst-Pass-6f5e4d3c2b1a"
TICK_SECRET = "tick-Secret-00112233445566778899aabbccdd"
SECRETS = (OWNER_PASSWORD, API_PASSWORD, SCHEDULER_PASSWORD, ANALYST_PASSWORD, TICK_SECRET)
DB = "deploy_secrets"

# Just enough of Vault, pg_net and pg_cron for cron/schedule_tick.sql (their signatures).
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
    UPDATE vault.secrets SET secret = coalesce(new_secret, secret) WHERE id = secret_id $$;
CREATE SCHEMA net;
CREATE TABLE net.http_request_queue (id bigserial, method text, url text, headers jsonb,
                                     body bytea, timeout_milliseconds int);
CREATE FUNCTION net.http_post(url text, body jsonb DEFAULT '{}'::jsonb,
                              params jsonb DEFAULT '{}'::jsonb,
                              headers jsonb DEFAULT '{}'::jsonb,
                              timeout_milliseconds integer DEFAULT 5000)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO net.http_request_queue (method, url, headers, body, timeout_milliseconds)
    VALUES ('POST', url, headers, convert_to(body::text, 'UTF8'), timeout_milliseconds)
    RETURNING id $$;
GRANT USAGE ON SCHEMA net TO PUBLIC;
GRANT ALL ON ALL TABLES IN SCHEMA net TO PUBLIC;
GRANT ALL ON ALL SEQUENCES IN SCHEMA net TO PUBLIC;
CREATE SCHEMA cron;
CREATE TABLE cron.job (jobid bigserial PRIMARY KEY, schedule text, command text,
                       username text NOT NULL DEFAULT current_user, jobname text UNIQUE);
CREATE FUNCTION cron.schedule(job_name text, schedule text, command text) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO cron.job (jobname, schedule, command) VALUES (job_name, schedule, command)
    ON CONFLICT (jobname) DO UPDATE SET schedule = EXCLUDED.schedule, command = EXCLUDED.command
    RETURNING jobid $$;
CREATE EXTENSION pgcrypto;
"""

RECORDER = """#!{python}
# Records the command line this process has, as /proc shows it to any local user, then
# becomes the real tool (same pid, same command line).
import json, os, sys
with open("/proc/self/cmdline", "rb") as f:
    cmdline = f.read().decode(errors="replace").split("\\0")
with open({log!r}, "a", encoding="utf-8") as f:
    f.write(json.dumps(cmdline) + "\\n")
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
"""


@pytest.fixture(scope="module")
def logged_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster(tempfile.mkdtemp(prefix="sftq-test-secrets-", dir="/tmp"),
                           settings={"log_statement": "'all'", "log_min_duration_statement": "0",
                                     "log_min_error_statement": "'info'", "fsync": "off"})
    cluster.init()
    # The logins made by deploy.sh authenticate with SCRAM; everyone else is trusted.
    hba = cluster.pgdata / "pg_hba.conf"
    hba.write_text("host all sftq_api_login,sftq_scheduler_login,sftq_analyst_login "
                   "127.0.0.1/32 scram-sha-256\n"
                   "local all all trust\nhost all all 127.0.0.1/32 trust\n"
                   "host all all ::1/128 trust\n")
    cluster.start()
    try:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        migrate.migrate(cluster.url_for(DB))
        with psycopg.connect(cluster.url_for(DB), autocommit=True) as conn:
            conn.execute(STANDINS)
        yield cluster
    finally:
        cluster.destroy()


def test_no_secret_in_the_server_log_or_on_a_command_line(logged_cluster: LocalCluster,
                                                          tmp_path: Path) -> None:
    sftq = Path(sys.executable).parent / "sftq"
    psql = shutil.which("psql")
    assert sftq.exists() and psql is not None
    calls = tmp_path / "cmdlines.jsonl"
    wrappers = {}
    for name, real in (("sftq", str(sftq)), ("psql", psql)):
        wrapper = tmp_path / name
        wrapper.write_text(RECORDER.format(python=sys.executable, log=str(calls), real=real))
        wrapper.chmod(0o755)
        wrappers[name] = str(wrapper)
    log = logged_cluster.data_dir / "postgres.log"
    log_start = log.stat().st_size
    url = f"postgresql://postgres:{OWNER_PASSWORD}@127.0.0.1:{logged_cluster.port}/{DB}"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "SFTQ_BIN": wrappers["sftq"], "PSQL": wrappers["psql"],
           "SUPABASE_DB_URL": url, "SFTQ_API_DB_PASSWORD": API_PASSWORD,
           "SFTQ_SCHEDULER_DB_PASSWORD": SCHEDULER_PASSWORD,
           "SFTQ_ANALYST_DB_PASSWORD": ANALYST_PASSWORD, "SFTQ_TICK_SECRET": TICK_SECRET,
           "SFTQ_TICK_URL": "https://tick.example/functions/v1/scheduler-tick",
           "SFTQ_WEBHOOKS_DELIVER_URL": "https://tick.example/functions/v1/webhook-deliver"}
    for _ in range(2):  # the second run updates the logins and the Vault entry
        done = subprocess.run(["bash", str(DEPLOY), "db", "cron"], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, done.stderr
        for secret in SECRETS:
            assert secret not in done.stdout + done.stderr

    cmdlines = [json.loads(line) for line in calls.read_text().splitlines()]
    for cmdline in cmdlines:
        for secret in SECRETS:
            assert secret not in " ".join(cmdline), cmdline
    tools = [Path(c[1] if "python" in Path(c[0]).name else c[0]).name for c in cmdlines]
    assert tools.count("sftq") >= 8 and tools.count("psql") >= 8, cmdlines

    text = log.read_bytes()[log_start:].decode(errors="replace")
    assert "statement: " in text and "CREATE ROLE" in text  # statements were logged
    assert "SCRAM-SHA-256$" in text  # the verifier, computed by the client, is what travels
    for secret in SECRETS:
        assert secret not in text, f"{secret} appears in the server log"

    # What was stored works: the logins authenticate with their passwords (and only them),
    # and Vault holds the tick secret.
    for login, password in (("sftq_api_login", API_PASSWORD),
                            ("sftq_scheduler_login", SCHEDULER_PASSWORD),
                            ("sftq_analyst_login", ANALYST_PASSWORD)):
        base = dict(host="127.0.0.1", port=logged_cluster.port, dbname=DB, user=login)
        with psycopg.connect(**base, password=password) as conn:  # type: ignore[arg-type]
            assert conn.execute("SELECT current_user").fetchone() == (login,)
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(**base, password=password + "x")  # type: ignore[arg-type]
    with psycopg.connect(logged_cluster.url_for(DB), autocommit=True) as conn:
        stored = conn.execute("SELECT secret FROM vault.secrets WHERE name = 'sftq_tick_secret'"
                              ).fetchall()
        assert stored == [(TICK_SECRET,)]
        # Every job (the tick's, its reconcile passes' and the webhook deliveries') reads it
        # from Vault when it fires.
        commands = dict(conn.execute("SELECT jobname, command FROM cron.job").fetchall())
        assert set(commands) == {"sftq-scheduler-tick", "sftq-scheduler-reconcile",
                                 "sftq-webhooks-deliver"}
        assert not any(secret in c for c in commands.values() for secret in SECRETS)
        members = dict(conn.execute(
            "SELECT m.rolname, g.rolname FROM pg_auth_members a "
            "JOIN pg_roles m ON m.oid = a.member JOIN pg_roles g ON g.oid = a.roleid "
            "WHERE m.rolname LIKE 'sftq\\_%\\_login'").fetchall())
        assert members == {"sftq_api_login": "sftq_api", "sftq_scheduler_login": "sftq_scheduler",
                           "sftq_analyst_login": "sftq_analyst"}
