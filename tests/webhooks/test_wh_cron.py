"""cron/schedule_webhooks.sql and unschedule_webhooks.sql, run by psql as an operator would
(the tick secret on standard input), against stand-ins for Supabase's pg_cron, pg_net and
Vault (see tests/scheduler/test_sched_cron.py for the same approach, and for the check that
pg_net stays closed with both jobs scheduled): the job fires only when a delivery is due, the
poke trigger queues one request per transaction after a delivery is written, neither ever
sends the secret itself but a two-minute token of it that webhook-deliver accepts, a broken
poke never fails the job transaction, and running the scripts again is harmless."""

from __future__ import annotations

import hashlib
import hmac
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from fn_support import Db

from sftq_server import webhooks
from sftq_server.core.settings import Settings
from sftq_server.db import Database

CRON = Path(__file__).resolve().parents[2] / "cron"
PSQL = shutil.which("psql")
pytestmark = pytest.mark.skipif(PSQL is None, reason="psql is not installed")

URL = "https://europe-west1-acme.cloudfunctions.net/webhook-deliver"
SECRET = "tick-secret-for-webhooks-0123456789"
TOKEN = re.compile(r"Bearer v1\.([0-9]+)\.([0-9a-f]{64})")

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
CREATE TABLE net.calls (id bigserial PRIMARY KEY, url text NOT NULL, body jsonb, headers jsonb,
                        timeout_milliseconds integer, txid xid8 DEFAULT pg_current_xact_id());
CREATE FUNCTION net.http_post(url text, body jsonb DEFAULT '{}'::jsonb,
                              params jsonb DEFAULT '{}'::jsonb,
                              headers jsonb DEFAULT '{"Content-Type": "application/json"}'::jsonb,
                              timeout_milliseconds integer DEFAULT 5000)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO net.calls (url, body, headers, timeout_milliseconds)
    VALUES (url, body, headers, timeout_milliseconds) RETURNING id $$;
CREATE SCHEMA cron;
CREATE TABLE cron.job (jobid bigserial PRIMARY KEY, schedule text NOT NULL, command text NOT NULL,
                       jobname text UNIQUE);
CREATE FUNCTION cron.schedule(job_name text, schedule text, command text) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO cron.job (jobname, schedule, command) VALUES (job_name, schedule, command)
    ON CONFLICT (jobname) DO UPDATE SET schedule = EXCLUDED.schedule, command = EXCLUDED.command
    RETURNING jobid $$;
CREATE FUNCTION cron.unschedule(job_id bigint) RETURNS boolean LANGUAGE sql AS $$
    WITH d AS (DELETE FROM cron.job WHERE jobid = job_id RETURNING 1) SELECT EXISTS (SELECT FROM d)
$$;
-- The tokens are HMACs from pgcrypto, which Supabase installs in schema extensions.
CREATE SCHEMA IF NOT EXISTS extensions;
CREATE EXTENSION IF NOT EXISTS pgcrypto SCHEMA extensions;
"""


def psql(url: str, script: str, *, secret: str | None = SECRET,
         **variables: str) -> subprocess.CompletedProcess[str]:
    """Run a cron script as the docs say: the secret on standard input, never on argv."""
    assert PSQL is not None
    args = [PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(CRON / script)]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    return subprocess.run(args, input=secret or "", capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.fixture
def supa(db: Db, db_url: str) -> Db:
    db.conn.execute(STANDINS)
    return db


def check_token(authorization: str, secret: str = SECRET) -> None:
    """A token of the secret, minted just now, never the secret itself."""
    assert secret not in authorization
    match = TOKEN.fullmatch(authorization)
    assert match is not None, authorization
    assert abs(int(match[1]) - time.time()) <= 5
    assert match[2] == hmac.new(secret.encode(), match[1].encode(), hashlib.sha256).hexdigest()


def calls(db: Db) -> list[tuple[Any, ...]]:
    return db.conn.execute("SELECT url, headers, body, timeout_milliseconds FROM net.calls "
                           "ORDER BY id").fetchall()


def user_with_endpoints(db: Db, n: int) -> int:
    uid = int(db.one("SELECT sftq.create_user('hooked')"))
    for _ in range(n):
        db.conn.execute("SELECT sftq.webhook_create(%s, gen_random_uuid(), "
                        "'https://hooks.example.com/', ARRAY['job.*'], NULL, 'v0:x')", (uid,))
    return uid


def test_schedule_poke_and_catch_up(supa: Db, db_url: str) -> None:
    db = supa
    done = psql(db_url, "schedule_webhooks.sql", deliver_url=URL)
    assert done.returncode == 0, done.stderr
    # The poke lives in the cron wiring's own schema, never in sftq (issue 16, item 3).
    assert db.one("SELECT to_regproc('sftq_cron._webhook_poke') IS NOT NULL "
                  "AND to_regproc('sftq._webhook_poke') IS NULL") is True
    (schedule, command), = db.conn.execute(
        "SELECT schedule, command FROM cron.job WHERE jobname = 'sftq-webhooks-deliver'"
    ).fetchall()
    assert schedule == "5 seconds"
    assert URL not in command and SECRET not in command  # both come from Vault when it fires
    assert dict(db.conn.execute("SELECT name, decrypted_secret FROM vault.decrypted_secrets"
                                ).fetchall()) == {"sftq_webhooks_url": URL,
                                                  "sftq_tick_secret": SECRET}

    # Idle: the job fires nothing.
    db.conn.execute(command)
    assert calls(db) == []

    # A transaction that writes deliveries for three endpoints pokes once, after its commit.
    uid = user_with_endpoints(db, 3)
    db.conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid,))
    assert db.one("SELECT count(*) FROM sftq.webhook_deliveries") == 3
    (url, headers, body, timeout), = calls(db)
    assert (url, body, timeout) == (URL, {}, 25000)
    assert set(headers) == {"Content-Type", "Authorization"}
    assert headers["Content-Type"] == "application/json"
    check_token(headers["Authorization"])
    # Users without endpoints never poke.
    other = int(db.one("SELECT sftq.create_user('plain')"))
    db.conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (other,))
    assert len(calls(db)) == 1

    # Deliveries are due: the cron job fires too, with a token of its own.
    db.conn.execute(command)
    assert len(calls(db)) == 2
    assert calls(db)[1][0] == URL
    check_token(calls(db)[1][1]["Authorization"])
    assert not any(SECRET in str(row) for row in db.conn.execute(
        "SELECT * FROM net.calls").fetchall())

    # Again: replaces, never duplicates; a schedule and poke=off are honoured.
    done = psql(db_url, "schedule_webhooks.sql", deliver_url=URL + "2",
                deliver_schedule="* * * * *", poke="off")
    assert done.returncode == 0, done.stderr
    assert db.conn.execute("SELECT schedule FROM cron.job").fetchall() == [("* * * * *",)]
    assert db.one("SELECT count(*) FROM vault.secrets WHERE name = 'sftq_webhooks_url'") == 1
    assert db.one("SELECT count(*) FROM vault.secrets WHERE name = 'sftq_tick_secret'") == 1
    db.conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid,))
    assert len(calls(db)) == 2  # no trigger any more

    done = psql(db_url, "unschedule_webhooks.sql")
    assert done.returncode == 0, done.stderr
    assert db.one("SELECT count(*) FROM cron.job") == 0
    assert db.one("SELECT to_regproc('sftq_cron._webhook_poke') IS NULL "
                  "AND to_regproc('sftq._webhook_poke') IS NULL") is True
    assert psql(db_url, "unschedule_webhooks.sql").returncode == 0


def test_a_broken_poke_never_fails_the_job_transaction(supa: Db, db_url: str) -> None:
    db = supa
    assert psql(db_url, "schedule_webhooks.sql", deliver_url=URL).returncode == 0
    db.conn.execute(
        "CREATE OR REPLACE FUNCTION net.http_post(url text, body jsonb DEFAULT '{}', "
        "params jsonb DEFAULT '{}', headers jsonb DEFAULT '{}', "
        "timeout_milliseconds integer DEFAULT 5000) RETURNS bigint LANGUAGE plpgsql AS $$ "
        "BEGIN RAISE EXCEPTION 'pg_net is down'; END $$")
    uid = user_with_endpoints(db, 1)
    db.conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid,))
    assert db.one("SELECT count(*) FROM sftq.webhook_deliveries") == 1
    db.conn.execute("DELETE FROM vault.secrets WHERE name = 'sftq_webhooks_url'")
    db.conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid,))
    assert db.one("SELECT count(*) FROM sftq.webhook_deliveries") == 2


@pytest.mark.parametrize(("secret", "variables", "message"), [
    (None, {"deliver_url": URL}, "the tick secret is not set"),
    (SECRET, {}, "deliver_url is not set"),
    (SECRET, {"deliver_url": "not a url"}, "deliver_url must be an http(s) URL"),
    ("short-but-not-32-characters", {"deliver_url": URL}, "at least 32 characters"),
    # On the command line any local user could read it with ps: refused.
    (SECRET, {"deliver_url": URL, "tick_secret": SECRET}, "not taken as a psql variable"),
])
def test_the_script_refuses_bad_input_and_changes_nothing(
        supa: Db, db_url: str, secret: str | None, variables: dict[str, str],
        message: str) -> None:
    done = psql(db_url, "schedule_webhooks.sql", secret=secret, **variables)
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert supa.one("SELECT count(*) FROM cron.job") == 0
    assert supa.one("SELECT count(*) FROM vault.secrets") == 0
    assert supa.one("SELECT to_regproc('sftq_cron._webhook_poke') IS NULL "
                    "AND to_regproc('sftq._webhook_poke') IS NULL") is True


def test_webhook_deliver_accepts_the_token_and_nothing_stale(
        supa: Db, db_url: str, settings: Settings, database: Database) -> None:
    """The Python side of the token, against what the SQL side queued: webhook-deliver
    authenticates exactly as scheduler-tick does (tick_http.bearer_ok)."""
    db = supa
    assert psql(db_url, "schedule_webhooks.sql", secret=SECRET, deliver_url=URL).returncode == 0
    uid = user_with_endpoints(db, 1)
    db.conn.execute("SELECT sftq.enqueue(%s, 'SFT', '{}'::jsonb)", (uid,))
    (_, headers, _, _), = calls(db)
    token = headers["Authorization"]
    db.conn.execute("DELETE FROM sftq.webhook_deliveries")  # nothing to send anywhere
    app = webhooks.make_deliver_app(
        Settings(database_url=db_url, tick_secret=SECRET, webhooks_key=settings.webhooks_key),
        db=database)
    status, _, body = app.handle("POST", token)
    assert status == 200, body
    assert app.handle("POST", f"Bearer {SECRET}")[0] == 200  # a person's curl
    seconds, mac = token.removeprefix("Bearer v1.").split(".")
    for bad in (f"Bearer v1.{seconds}.{'0' * 64}",                      # forged
                f"Bearer v1.{int(seconds) - 600}."                         # stale
                + hmac.new(SECRET.encode(), str(int(seconds) - 600).encode(),
                           hashlib.sha256).hexdigest(),
                f"Bearer v1.{seconds}.{mac}".replace(mac, mac[:-1] + ("0" if mac[-1] != "0"
                                                                      else "1"))):
        assert app.handle("POST", bad)[0] == 401, bad
