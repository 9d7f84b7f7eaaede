"""infra/deploy.sh: the exact commands it prints, that a dry run runs nothing, that a real
run runs exactly what it prints (against stand-ins for gcloud, psql and sftq), that secrets
never show, and that missing settings stop it before anything runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import httpx
import psycopg
import pytest
from infra_support import (
    ACCESS_TOKEN,
    ANALYST_DB_PASSWORD,
    API_DB_PASSWORD,
    DB_PASSWORD,
    FIREWORKS_KEY,
    ROOT,
    SCHEDULER_DB_PASSWORD,
    SECRETS,
    SETTINGS,
    TICK_SECRET,
    WEBHOOKS_KEY,
    Runner,
    Served,
    cancel,
    mask,
    printed_commands,
    sse_frames,
    user_key_and_job,
)

from sftq_server.dev.pgcluster import free_port

DB = "'postgresql://postgres:***@db.abcdefgh.supabase.co:5432/postgres'"
# psql gets the URL without its password, and the password in its environment.
PSQL = ("PGPASSWORD='***' psql postgresql://postgres@db.abcdefgh.supabase.co:5432/postgres "
        "-X -q -v ON_ERROR_STOP=1")
SFTQ = f"DATABASE_URL={DB} sftq"
MIGRATE = f"SFTQ_SQL_DIR=sql {SFTQ} db migrate"
CHECK_DATA_API = f"{PSQL} -f infra/sql/check_data_api.sql"
SA = "sftq-runtime@sftq-prod.iam.gserviceaccount.com"
API_URL = ("postgresql://sftq_api_login.abcdefgh:api%20p%40ss%3Aw%2Frd%230123456789"
           "@aws-0-eu-west-1.pooler.supabase.com:6543/postgres")
FUNCTIONS = {"jobs-api": ("jobs_api.py", "jobs_api"),
             "analytics": ("analytics_api.py", "analytics"),
             "scheduler-tick": ("scheduler_tick.py", "scheduler_tick"),
             "webhook-deliver": ("webhook_deliver.py", "webhook_deliver"),
             "jobs-stream": ("jobs_stream.py", "jobs_stream")}


def test_scripts_parse() -> None:
    scripts = sorted((ROOT / "infra").glob("**/*.sh"))
    assert scripts
    for script in scripts:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, (script, proc.stderr)
        assert "set -euo pipefail" in script.read_text()
        if shutil.which("shellcheck"):  # a deeper lint where it is installed
            proc = subprocess.run(["shellcheck", "-x", str(script)], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout


def test_usage_errors(deploy: Runner) -> None:
    for args in ((), ("deploy-everything",), ("db", "--only")):
        r = deploy(*args)
        assert r.code == 2 and "usage: infra/deploy.sh" in r.stderr
        assert r.stdout == "" and r.calls == []
    r = deploy("--help")
    assert r.code == 0 and "unschedule" in r.stdout


# ---- db ---------------------------------------------------------------------------------

def test_db_dry_run(deploy: Runner) -> None:
    r = deploy("--dry-run", "db", env=SETTINGS | {"SFTQ_ANALYST_DB_PASSWORD": ANALYST_DB_PASSWORD})
    assert r.code == 0, r.stderr
    assert r.lines == [
        MIGRATE,
        f"printf %s '***' | {SFTQ} db login-role sftq_api_login --member-of sftq_api "
        "--statement-timeout 30s",
        f"printf %s '***' | {SFTQ} db login-role sftq_scheduler_login --member-of sftq_scheduler "
        "--statement-timeout 60s",
        f"printf %s '***' | {SFTQ} db login-role sftq_analyst_login --member-of sftq_analyst "
        "--statement-timeout 5min",
        CHECK_DATA_API,
    ]
    assert "SUPABASE_ACCESS_TOKEN is not set" in r.stderr
    assert r.calls == []  # a dry run runs nothing


def test_db_only_migrates_and_checks_unless_login_roles_are_asked_for(deploy: Runner) -> None:
    env = {"SUPABASE_DB_URL": SETTINGS["SUPABASE_DB_URL"]}
    r = deploy("db", "-n", env=env)
    assert r.code == 0, r.stderr
    assert r.lines == [MIGRATE, CHECK_DATA_API]


def test_db_asks_the_management_api_about_exposed_schemas(deploy: Runner) -> None:
    env = {"SUPABASE_DB_URL": SETTINGS["SUPABASE_DB_URL"], "SUPABASE_ACCESS_TOKEN": ACCESS_TOKEN}
    r = deploy("db", "-n", env=env)
    assert r.code == 0, r.stderr
    assert r.lines[-1] == ("printf %s 'header = \"Authorization: Bearer ***\"' | curl -fsS "
                           "--config - https://api.supabase.com/v1/projects/abcdefgh/postgrest")
    for schemas, ok in (("public, graphql_public", True), ("public,sftq", False),
                        ("sftq", False)):
        r = deploy("db", env=env | {"FAKE_CURL_ANSWER": json.dumps({"db_schema": schemas})})
        assert (r.code == 0) is ok, (schemas, r.stderr)
        if not ok:
            assert "schema sftq is among the Data API's exposed schemas" in r.stderr
        curl = [c for c in r.calls if c["argv"][0] == "curl"]
        assert len(curl) == 1 and ACCESS_TOKEN in curl[0]["stdin"]
        assert ACCESS_TOKEN not in " ".join(curl[0]["argv"])


def test_db_refuses_the_transaction_pooler(deploy: Runner) -> None:
    r = deploy("--dry-run", "db", env={"SUPABASE_DB_URL": SETTINGS["SUPABASE_POOLER_URL"]})
    assert r.code == 1
    assert "transaction pooler (port 6543)" in r.stderr and "5432" in r.stderr
    assert r.stdout == ""


def test_db_rejects_a_weak_login_password_and_a_non_url(deploy: Runner) -> None:
    r = deploy("--dry-run", "db", env=SETTINGS | {"SFTQ_API_DB_PASSWORD": "short"})
    assert r.code == 1 and "SFTQ_API_DB_PASSWORD is shorter than 16" in r.stderr
    r = deploy("--dry-run", "db", env=SETTINGS | {"SFTQ_SCHEDULER_DB_PASSWORD": "short"})
    assert r.code == 1 and "SFTQ_SCHEDULER_DB_PASSWORD is shorter than 16" in r.stderr
    r = deploy("--dry-run", "db", env={"SUPABASE_DB_URL": "host=db.example port=5432"})
    assert r.code == 1 and "SUPABASE_DB_URL must look like postgresql://" in r.stderr


# ---- secrets ----------------------------------------------------------------------------

def _secret_lines(short: str, value: str, sa: str | None = None) -> list[str]:
    name = f"sftq-{short}"
    lines = [
        f"gcloud secrets describe {name} --project=sftq-prod --quiet >/dev/null 2>&1 || "
        f"gcloud secrets create {name} --project=sftq-prod --replication-policy=automatic --quiet",
        f"printf %s {value} | gcloud secrets versions add {name} --project=sftq-prod "
        "--data-file=- --quiet",
    ]
    if sa:
        lines.append(f"gcloud secrets add-iam-policy-binding {name} --project=sftq-prod "
                     f"--member=serviceAccount:{sa} --role=roles/secretmanager.secretAccessor "
                     "--quiet")
    return lines


def test_secrets_dry_run(deploy: Runner) -> None:
    r = deploy("--dry-run", "secrets", env=SETTINGS | {"GCP_SERVICE_ACCOUNT": SA})
    assert r.code == 0, r.stderr
    api = "'postgresql://sftq_api_login.abcdefgh:***@aws-0-eu-west-1.pooler.supabase.com:6543/postgres'"
    scheduler = ("'postgresql://sftq_scheduler_login.abcdefgh:***"
                 "@aws-0-eu-west-1.pooler.supabase.com:6543/postgres'")
    assert r.lines == [
        *_secret_lines("database-url", scheduler, SA),
        *_secret_lines("api-database-url", api, SA),
        *_secret_lines("analytics-database-url", api, SA),
        *_secret_lines("fireworks-api-key", "'***'", SA),
        *_secret_lines("tick-secret", "'***'", SA),
        *_secret_lines("webhooks-key", "'***'", SA),
    ]
    assert r.calls == []


def test_analytics_may_use_its_own_database_url(deploy: Runner) -> None:
    replica = "postgresql://sftq_api_login.abcdefgh:replica-pass-123456@replica.example:6543/postgres"
    r = deploy("--dry-run", "secrets", "--only", "analytics-database-url",
               env=SETTINGS | {"ANALYTICS_DATABASE_URL": replica})
    assert r.code == 0, r.stderr
    assert r.lines == _secret_lines(
        "analytics-database-url", "'postgresql://sftq_api_login.abcdefgh:***@replica.example:6543/postgres'")


def test_secrets_only_one_needs_only_its_settings(deploy: Runner) -> None:
    env = {"GCP_PROJECT": "sftq-prod", "SFTQ_TICK_SECRET": TICK_SECRET}
    r = deploy("--dry-run", "secrets", "--only=tick-secret", env=env)
    assert r.code == 0, r.stderr
    assert r.lines == _secret_lines("tick-secret", "'***'")
    r = deploy("--dry-run", "secrets", "--only", "tick-secret,fireworks-api-key", env=env)
    assert r.code == 1 and "FIREWORKS_API_KEY" in r.stderr and "SFTQ_TICK_SECRET" not in r.stderr
    r = deploy("--dry-run", "secrets", "--only", "tick-secrets", env=env)
    assert r.code == 1 and "unknown secrets name 'tick-secrets'" in r.stderr
    r = deploy("--dry-run", "secrets", "db", "--only", "tick-secret", env=env)
    assert r.code == 1
    assert "--only goes with a single secrets, services or functions step" in r.stderr


def test_the_webhooks_key_is_generated_once_and_never_replaced(deploy: Runner) -> None:
    """Without SFTQ_WEBHOOKS_KEY a key is made, and stored only while Secret Manager holds no
    version: a new key would leave every endpoint sealed under the old one unusable."""
    env = {"GCP_PROJECT": "sftq-prod"}
    guarded = ("gcloud secrets versions describe latest --secret=sftq-webhooks-key "
               "--project=sftq-prod --quiet >/dev/null 2>&1 || printf %s '***' | gcloud secrets "
               "versions add sftq-webhooks-key --project=sftq-prod --data-file=- --quiet")
    r = deploy("--dry-run", "secrets", "--only", "webhooks-key", env=env)
    assert r.code == 0, r.stderr
    assert r.lines == [_secret_lines("webhooks-key", "'***'")[0], guarded]

    # A new project: the secret and its first version are made, the key on stdin only.
    r = deploy("secrets", "--only", "webhooks-key", env=env, missing_secrets="sftq-webhooks-key")
    assert r.code == 0, r.stderr
    added = [c for c in r.calls if c["argv"][1:4] == ["secrets", "versions", "add"]]
    assert len(added) == 1
    key = added[0]["stdin"]
    assert re.fullmatch(r"[A-Za-z0-9+/]{43}=", key), key  # 32 random bytes, base64
    assert key not in r.stdout + r.stderr
    assert all(key not in " ".join(c["argv"]) for c in r.calls)
    assert any(c["argv"][1:3] == ["secrets", "create"] for c in r.calls)
    # The key exists: a later run keeps it.
    r = deploy("secrets", "--only", "webhooks-key", env=env)
    assert r.code == 0, r.stderr
    assert not any(c["argv"][1:4] == ["secrets", "versions", "add"] for c in r.calls)
    assert [c["argv"][1:4] for c in r.calls] == [["secrets", "describe", "sftq-webhooks-key"],
                                                 ["secrets", "versions", "describe"]]

    # Given, it is a new version like any other secret; each key must be long enough.
    r = deploy("--dry-run", "secrets", "--only", "webhooks-key",
               env=env | {"SFTQ_WEBHOOKS_KEY": WEBHOOKS_KEY})
    assert r.code == 0 and r.lines == _secret_lines("webhooks-key", "'***'")
    for weak in ("short", WEBHOOKS_KEY + ",short-key"):
        r = deploy("--dry-run", "secrets", "--only", "webhooks-key",
                   env=env | {"SFTQ_WEBHOOKS_KEY": weak})
        assert r.code == 1 and "each key must be at least 32 characters" in r.stderr
        assert r.stdout == ""


def test_api_database_url_is_never_the_owner(deploy: Runner) -> None:
    env = {k: v for k, v in SETTINGS.items() if k != "SFTQ_API_DB_PASSWORD"}
    r = deploy("--dry-run", "secrets", env=env)
    assert r.code == 1
    assert "SFTQ_API_DB_PASSWORD" in r.stderr and "never connect as the owner" in r.stderr
    explicit = "postgresql://someone.abcdefgh:explicit-pass-123456@pooler.example:6543/postgres"
    r = deploy("--dry-run", "secrets", "--only", "api-database-url",
               env=env | {"SFTQ_API_DATABASE_URL": explicit})
    assert r.code == 0, r.stderr
    assert r.lines == _secret_lines("api-database-url",
                                    "'postgresql://someone.abcdefgh:***@pooler.example:6543/postgres'")


def test_the_scheduler_connects_as_its_own_login_never_the_owner(deploy: Runner) -> None:
    env = {k: v for k, v in SETTINGS.items() if k != "SFTQ_SCHEDULER_DB_PASSWORD"}
    r = deploy("--dry-run", "secrets", "--only", "database-url", env=env)
    assert r.code == 1
    assert "SFTQ_SCHEDULER_DB_PASSWORD" in r.stderr and "never connect as the owner" in r.stderr
    r = deploy("--dry-run", "secrets", "--only", "database-url", env=SETTINGS)
    assert r.code == 0, r.stderr
    assert "sftq_scheduler_login.abcdefgh:***@" in r.lines[1]
    explicit = "postgresql://sched.abcdefgh:explicit-pass-123456@pooler.example:6543/postgres"
    r = deploy("--dry-run", "secrets", "--only", "database-url",
               env=env | {"SFTQ_SCHEDULER_DATABASE_URL": explicit})
    assert r.code == 0, r.stderr
    assert r.lines == _secret_lines("database-url",
                                    "'postgresql://sched.abcdefgh:***@pooler.example:6543/postgres'")


# ---- functions --------------------------------------------------------------------------

def _deploy_line(name: str, build: Path, env_vars: str, secrets: str, timeout: str = "60s",
                 sizing: str = "") -> str:
    entry = FUNCTIONS[name][1]
    return (f"gcloud functions deploy {name} --project=sftq-prod --region=europe-west1 --gen2 "
            f"--runtime=python311 --source={build}/{name} --entry-point={entry} --trigger-http "
            f"--allow-unauthenticated --timeout={timeout} {sizing}{env_vars} "
            f"--set-secrets={secrets} --quiet")


def _fake_functions_dir(tmp_path: Path) -> Path:
    """Stub entry files beside the real sftq_server: the folder layout the script expects."""
    d = tmp_path / "functions-src"
    d.mkdir()
    subprocess.run(["cp", "-R", str(ROOT / "functions" / "sftq_server"), str(d)], check=True)
    (d / "sftq_server" / "__pycache__").mkdir(exist_ok=True)
    (d / "sftq_server" / "__pycache__" / "junk.cpython-311.pyc").write_bytes(b"junk")
    for file, entry in FUNCTIONS.values():
        (d / file).write_text(f"def {entry}(request):\n    return {entry!r}\n")
    return d


def test_functions_dry_run(deploy: Runner, tmp_path: Path) -> None:
    build = tmp_path / "build"
    env = SETTINGS | {"SFTQ_BUILD_DIR": str(build),
                      "SFTQ_FUNCTIONS_DIR": str(_fake_functions_dir(tmp_path)),
                      "SFTQ_DB_POOL_MAX": "2", "FIREWORKS_QUOTA_ID": "training-h100-count"}
    r = deploy("--dry-run", "functions", env=env)
    assert r.code == 0, r.stderr
    assert r.lines == [
        _deploy_line("jobs-api", build,
                     "--set-env-vars=FIREWORKS_ACCOUNT_ID=acme,FIREWORKS_QUOTA_ID=training-h100-count,"
                     "SFTQ_DB_POOL_MAX=2",
                     "DATABASE_URL=sftq-api-database-url:latest,"
                     "FIREWORKS_API_KEY=sftq-fireworks-api-key:latest,"
                     "SFTQ_WEBHOOKS_KEY=sftq-webhooks-key:latest"),
        _deploy_line("analytics", build, "--set-env-vars=SFTQ_DB_POOL_MAX=2",
                     "DATABASE_URL=sftq-analytics-database-url:latest"),
        _deploy_line("scheduler-tick", build,
                     "--set-env-vars=FIREWORKS_ACCOUNT_ID=acme,FIREWORKS_QUOTA_ID=training-h100-count,"
                     "SFTQ_DB_POOL_MAX=2",
                     "DATABASE_URL=sftq-database-url:latest,"
                     "FIREWORKS_API_KEY=sftq-fireworks-api-key:latest,"
                     "SFTQ_TICK_SECRET=sftq-tick-secret:latest", timeout="110s"),
        # The delivery pass claims with the scheduler's procedures, and checks the tick's
        # secret (or its token); never the Fireworks key.
        _deploy_line("webhook-deliver", build, "--set-env-vars=SFTQ_DB_POOL_MAX=2",
                     "DATABASE_URL=sftq-database-url:latest,"
                     "SFTQ_TICK_SECRET=sftq-tick-secret:latest,"
                     "SFTQ_WEBHOOKS_KEY=sftq-webhooks-key:latest",
                     sizing="--memory=512Mi --cpu=1 --concurrency=4 "),
        # Streams: the API's login, a thousand per instance, an hour's request timeout.
        _deploy_line("jobs-stream", build, "--set-env-vars=SFTQ_DB_POOL_MAX=2",
                     "DATABASE_URL=sftq-api-database-url:latest", timeout="3600s",
                     sizing="--memory=512Mi --cpu=1 --concurrency=1000 "),
    ]
    assert r.calls == []

    packages = ("functions-framework", "psycopg[binary]", "psycopg-pool", "pydantic", "httpx",
                "werkzeug", "cryptography", "prometheus_client")
    pins = {f"{p}=={metadata.version(p.split('[')[0])}" for p in packages}
    for name, (file, entry) in FUNCTIONS.items():
        staged = build / name
        files = {str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()}
        assert {"main.py", "requirements.txt", f"functions/{file}",
                "functions/sftq_server/__init__.py",
                "functions/sftq_server/db/__init__.py"} <= files
        assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
        assert not any(f.startswith("sql/") or f.endswith(".sql") for f in files)
        others = {f"functions/{f}" for f, _ in FUNCTIONS.values()} - {f"functions/{file}"}
        assert not files & others, "each function ships only its own entry file"
        requirements = (staged / "requirements.txt").read_text().splitlines()
        assert {line for line in requirements if not line.startswith("#")} == pins
        main = (staged / "main.py").read_text()
        assert f"from {file[:-3]} import {entry}" in main
        # jobs-stream is registered for functions-framework's ASGI stack; the others are not.
        assert ("functions_framework.aio.http(" in main) is (name == "jobs-stream")
        # main.py finds the entry point with nothing but the staged folder on the path.
        code = f"import sys; sys.path.insert(0, ''); import main; print(main.{entry}(None))"
        proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=staged, capture_output=True,
                              text=True)
        assert proc.stdout.strip() == entry, proc.stderr


def test_a_stream_must_end_before_its_request_is_cut(deploy: Runner, tmp_path: Path) -> None:
    env = SETTINGS | {"SFTQ_BUILD_DIR": str(tmp_path / "b"),
                      "SFTQ_FUNCTIONS_DIR": str(_fake_functions_dir(tmp_path))}
    for step in ("functions", "services"):
        for value, ok in (("3300", True), ("3539.5", True), ("3540", False), ("7200", False),
                          ("an hour", False)):
            r = deploy("--dry-run", step, "--only", "jobs-stream",
                       env=env | {"SFTQ_STREAM_MAX_SECONDS": value})
            assert (r.code == 0) is ok, (step, value, r.stderr)
            if ok:
                assert f"SFTQ_STREAM_MAX_SECONDS={value}" in r.stdout
                assert "--timeout=3600s" in r.stdout
            else:
                assert "SFTQ_STREAM_MAX_SECONDS" in r.stderr and r.stdout == ""
        # Only jobs-stream reads it: deploying the others is not held up by it.
        r = deploy("--dry-run", step, "--only", "analytics",
                   env=env | {"SFTQ_STREAM_MAX_SECONDS": "7200"})
        assert r.code == 0, r.stderr


def test_functions_env_vars_must_not_carry_commas(deploy: Runner, tmp_path: Path) -> None:
    env = SETTINGS | {"SFTQ_BUILD_DIR": str(tmp_path / "b"),
                      "SFTQ_FUNCTIONS_DIR": str(_fake_functions_dir(tmp_path)),
                      "FIREWORKS_BASE_URL": "https://a.example,https://b.example"}
    r = deploy("--dry-run", "functions", "--only", "jobs-api", env=env)
    assert r.code == 1 and "FIREWORKS_BASE_URL contains a comma" in r.stderr


def test_functions_get_every_setting_the_code_reads(deploy: Runner, tmp_path: Path) -> None:
    """Each variable the runtime code reads reaches some function, as a plain env var or a
    secret. A setting added to the code but not to deploy.sh fails here."""
    runtime = [ROOT / "functions" / f for f, _ in FUNCTIONS.values()]
    # Every room that serves; dev/, cli/, the simulator and the migrator run only on a
    # workstation or in deploy.sh's own process.
    server = ROOT / "functions" / "sftq_server"
    runtime += [f for f in server.rglob("*.py")
                if f.relative_to(server).parts[0] not in ("dev", "cli", "simulator")
                and f.relative_to(server).as_posix() != "db/migrate.py"]
    read: set[str] = set()
    for path in runtime:
        if path.exists():
            read |= set(re.findall(r'"((?:SFTQ|FIREWORKS)_[A-Z0-9_]+|(?:ANALYTICS_)?DATABASE_URL)"',
                                   path.read_text()))
    assert {"DATABASE_URL", "SFTQ_TICK_SECRET", "FIREWORKS_API_KEY", "SFTQ_DB_POOL_MAX",
            "SFTQ_WEBHOOKS_KEY", "SFTQ_STREAM_MAX_SECONDS"} <= read

    passthrough = {n: "1" for n in read if n not in SETTINGS and "DATABASE_URL" not in n}
    passthrough["SFTQ_STREAM_MAX_SECONDS"] = "3300"
    env = SETTINGS | passthrough | {"SFTQ_BUILD_DIR": str(tmp_path / "b"),
                                    "SFTQ_FUNCTIONS_DIR": str(_fake_functions_dir(tmp_path))}
    r = deploy("--dry-run", "functions", env=env)
    assert r.code == 0, r.stderr
    delivered: set[str] = set()
    for line in r.lines:
        for flag in ("--set-env-vars=", "--set-secrets="):
            value = next(w for w in line.split() if w.startswith(flag))[len(flag):]
            delivered |= {pair.split("=", 1)[0] for pair in value.split(",")}
    # ANALYTICS_DATABASE_URL is the analytics function's own name for its DATABASE_URL, and
    # SFTQ_DEV_STACK (which relaxes the tick secret's length) belongs to a local dev stack only.
    assert read - delivered <= {"ANALYTICS_DATABASE_URL", "SFTQ_DEV_STACK"}, read - delivered
    assert "SFTQ_DEV_STACK" not in (ROOT / "infra" / "deploy.sh").read_text()


def test_staged_functions_serve_from_the_staged_folder_alone(
        deploy: Runner, tmp_path: Path, db_url: str) -> None:
    """The real functions, staged: each loads under functions-framework from its folder alone
    (not from the checkout) and answers; jobs-api and analytics reach a migrated database."""
    missing = [f for f, _ in FUNCTIONS.values() if not (ROOT / "functions" / f).exists()]
    assert not missing, missing
    build = tmp_path / "build"
    r = deploy("--dry-run", "functions", env=SETTINGS | {"SFTQ_BUILD_DIR": str(build)})
    assert r.code == 0, r.stderr
    probe = """
import json, sys
import functions_framework
client = functions_framework.create_app(target=sys.argv[1], source="main.py").test_client()
method, path = sys.argv[2], sys.argv[3]
resp = client.open(path, method=method, headers={"Authorization": "Bearer wrong"})
print(json.dumps({"status": resp.status_code, "package": sys.modules["sftq_server"].__file__}))
"""
    cases = [("jobs-api", "GET", "/health", 200), ("analytics", "GET", "/health", 200),
             ("scheduler-tick", "POST", "/", 401), ("webhook-deliver", "POST", "/", 401)]
    if (ROOT / "docs" / "openapi.json").exists():
        cases.append(("jobs-api", "GET", "/openapi.json", 200))
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": db_url, "SFTQ_TICK_SECRET": TICK_SECRET,
           "FIREWORKS_API_KEY": FIREWORKS_KEY, "FIREWORKS_ACCOUNT_ID": "acme",
           "FIREWORKS_BASE_URL": "http://127.0.0.1:9"}
    for name, method, path, status in cases:
        staged = build / name
        proc = subprocess.run([sys.executable, "-I", "-c", probe, FUNCTIONS[name][1], method, path],
                              cwd=staged, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["status"] == status, (name, path, out, proc.stderr[-2000:])
        assert Path(out["package"]).resolve().is_relative_to(staged.resolve()), out


def test_the_staged_stream_runs_on_functions_frameworks_asgi_stack(
        deploy: Runner, tmp_path: Path, db_url: str) -> None:
    """jobs-stream staged for `gcloud functions deploy`, started from its folder alone the way
    the Python buildpack starts a function (functions-framework --target, which finds the
    target registered for ASGI and serves it with uvicorn workers under gunicorn): a real
    stream, its errors as the envelope, its frames live until `end`."""
    build = tmp_path / "build"
    r = deploy("--dry-run", "functions", "--only", "jobs-stream",
               env=SETTINGS | {"SFTQ_BUILD_DIR": str(build)})
    assert r.code == 0, r.stderr
    staged = build / "jobs-stream"
    user, key, job = user_key_and_job(db_url)
    port = free_port()
    server = Served([sys.executable, "-I", "-m", "functions_framework", "--target", "jobs_stream",
                     "--source", "main.py", "--host", "127.0.0.1", "--port", str(port)],
                    port, {"DATABASE_URL": db_url, "SFTQ_STREAM_POLL_MS": "100",
                           "SFTQ_STREAM_HEARTBEAT_SECONDS": "1"}, cwd=staged)
    try:
        denied = httpx.get(f"{server.url}/jobs/{job}/stream", timeout=10,
                           headers={"Authorization": "Bearer nope"})
        assert denied.status_code == 401 and denied.json()["code"] == "unauthorized"
        with httpx.stream("GET", f"{server.url}/jobs/{job}/stream", timeout=httpx.Timeout(20.0),
                          headers={"Authorization": f"Bearer {key}"}) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            live = sse_frames(resp)
            first = next(live)
            assert (first.event, first.data["id"], first.data["state"]) == \
                ("status", job, "QUEUED")
            cancel(db_url, user, job)
            assert [(f.event, f.data.get("state")) for f in live] == \
                [("status", "CANCELLED"), ("end", None)]
    finally:
        server.stop()
    assert b"Traceback" not in server.output, server.output.decode()


# ---- cron -------------------------------------------------------------------------------

def test_cron_dry_run(deploy: Runner) -> None:
    check = f"{PSQL} -f cron/check_net_private.sql"
    env = {k: v for k, v in SETTINGS.items() if k != "SUPABASE_URL"}
    r = deploy("--dry-run", "cron", env=env)
    assert r.code == 0, r.stderr
    # Both scripts get the tick secret on stdin (the webhooks job sends tokens of it too);
    # the check runs after both.
    assert r.lines == [
        f"printf %s '***' | {PSQL} "
        "-v tick_url=https://europe-west1-sftq-prod.cloudfunctions.net/scheduler-tick "
        "-f cron/schedule_tick.sql",
        f"printf %s '***' | {PSQL} "
        "-v deliver_url=https://europe-west1-sftq-prod.cloudfunctions.net/webhook-deliver "
        "-f cron/schedule_webhooks.sql", check]
    # Through the Edge proxies when SUPABASE_URL is set.
    r = deploy("--dry-run", "cron", env=env | {"SUPABASE_URL": "https://abcdefgh.supabase.co/"})
    assert r.code == 0, r.stderr
    assert "-v tick_url=https://abcdefgh.supabase.co/functions/v1/scheduler-tick " in r.lines[0]
    assert ("-v deliver_url=https://abcdefgh.supabase.co/functions/v1/webhook-deliver "
            in r.lines[1])
    env = {"SUPABASE_DB_URL": SETTINGS["SUPABASE_DB_URL"], "SFTQ_TICK_SECRET": TICK_SECRET,
           "SFTQ_TICK_URL": "https://tick.example.com/functions/v1/scheduler-tick",
           "SFTQ_WEBHOOKS_DELIVER_URL": "https://hooks.example.com/webhook-deliver"}
    r = deploy("--dry-run", "cron", env=env)
    assert r.code == 0, r.stderr
    assert r.lines == [f"printf %s '***' | {PSQL} "
                       "-v tick_url=https://tick.example.com/functions/v1/scheduler-tick "
                       "-f cron/schedule_tick.sql",
                       f"printf %s '***' | {PSQL} "
                       "-v deliver_url=https://hooks.example.com/webhook-deliver "
                       "-f cron/schedule_webhooks.sql", check]
    # Without the deliver URL (or SUPABASE_URL) it is derived from the project and region.
    r = deploy("--dry-run", "cron",
               env={k: v for k, v in env.items() if k != "SFTQ_WEBHOOKS_DELIVER_URL"})
    assert r.code == 1 and "GCP_PROJECT" in r.stderr and r.stdout == ""
    r = deploy("--dry-run", "unschedule", env=env)
    assert r.lines == [f"{PSQL} -f cron/unschedule_tick.sql",
                       f"{PSQL} -f cron/unschedule_webhooks.sql"]
    assert r.calls == []
    # scheduler-tick and cron/_tick_secrets.sql refuse a short secret; the script says so first.
    for step in ("cron", "secrets"):
        r = deploy("--dry-run", step, env=SETTINGS | {"SFTQ_TICK_SECRET": "x" * 31})
        assert r.code == 1 and "SFTQ_TICK_SECRET is shorter than 32" in r.stderr
        assert r.stdout == ""


# ---- missing settings -------------------------------------------------------------------

@pytest.mark.parametrize(("step", "required"), [
    ("db", ["SUPABASE_DB_URL"]),
    ("secrets", ["GCP_PROJECT", "SUPABASE_POOLER_URL", "SFTQ_API_DB_PASSWORD", "FIREWORKS_API_KEY",
                 "SFTQ_TICK_SECRET", "SFTQ_SCHEDULER_DB_PASSWORD"]),
    ("functions", ["GCP_PROJECT", "GCP_REGION", "FIREWORKS_ACCOUNT_ID"]),
    ("services", ["GCP_PROJECT", "GCP_REGION", "FIREWORKS_ACCOUNT_ID"]),
    ("cron", ["SUPABASE_DB_URL", "SFTQ_TICK_SECRET", "GCP_PROJECT", "GCP_REGION"]),
    ("unschedule", ["SUPABASE_DB_URL"]),
])
@pytest.mark.parametrize("dry", [True, False])
def test_missing_settings_are_named_and_nothing_runs(deploy: Runner, step: str, required: list[str],
                                                     dry: bool) -> None:
    r = deploy(*(["--dry-run"] if dry else []), step)
    assert r.code == 1
    assert f"error: missing settings for {step}:" in r.stderr
    for name in required:
        assert f"  {name}: " in r.stderr, (name, r.stderr)
    assert r.stdout == "" and r.calls == []


def test_all_checks_every_step_before_running_any(deploy: Runner) -> None:
    env = {k: v for k, v in SETTINGS.items() if k != "GCP_REGION"}
    r = deploy("all", env=env)
    assert r.code == 1 and "GCP_REGION" in r.stderr
    assert r.stdout == "" and r.calls == [], "something ran although the run could not finish"


# ---- real runs (against the stand-ins) ----------------------------------------------------

def test_a_real_run_runs_exactly_what_it_prints(deploy: Runner, tmp_path: Path) -> None:
    steps = ["db", "secrets", "services", "functions", "cron"]
    env = SETTINGS | {"SFTQ_ANALYST_DB_PASSWORD": ANALYST_DB_PASSWORD, "GCP_SERVICE_ACCOUNT": SA,
                      "SFTQ_BUILD_DIR": str(tmp_path / "build"), "SFTQ_IMAGE_TAG": "t1",
                      "SUPABASE_ACCESS_TOKEN": ACCESS_TOKEN,
                      "FAKE_CURL_ANSWER": json.dumps({"db_schema": "public"}),
                      "SFTQ_FUNCTIONS_DIR": str(_fake_functions_dir(tmp_path))}
    r = deploy(*steps, env=env, missing_secrets="sftq-tick-secret,sftq-api-database-url")
    assert r.code == 0, r.stderr

    expected: list[tuple[list[str], str | None, dict[str, str]]] = []
    for line in r.lines:
        commands = printed_commands(line)
        if len(commands) == 2:  # describe || create: create only when describe failed
            describe, create = commands
            expected.append(describe)
            if describe[0][1] == "secrets" and describe[0][3] in ("sftq-tick-secret",
                                                                    "sftq-api-database-url"):
                expected.append(create)
        else:
            expected += commands
    ran = [(c["argv"], c["stdin"], c["env"]) for c in r.calls]
    assert len(ran) == len(expected)
    for (argv, stdin, child_env), (cmd, shown_stdin, shown_env) in zip(ran, expected, strict=True):
        assert [mask(w) for w in argv] == cmd
        assert mask(stdin) == (shown_stdin or "")
        assert {k: mask(v) for k, v in child_env.items() if k in shown_env} == shown_env

    # What reached the tools unmasked, and how: secrets on stdin or in the environment.
    stdin_of = {c["argv"][4]: c["stdin"] for c in r.calls
                if c["argv"][1:4] == ["secrets", "versions", "add"]}
    assert stdin_of["sftq-api-database-url"] == API_URL == stdin_of["sftq-analytics-database-url"]
    parsed = psycopg.conninfo.conninfo_to_dict(API_URL)
    assert parsed["user"] == "sftq_api_login.abcdefgh" and parsed["password"] == API_DB_PASSWORD
    scheduler = psycopg.conninfo.conninfo_to_dict(stdin_of["sftq-database-url"])
    assert scheduler["user"] == "sftq_scheduler_login.abcdefgh"
    assert scheduler["password"] == SCHEDULER_DB_PASSWORD
    assert stdin_of["sftq-fireworks-api-key"] == FIREWORKS_KEY
    assert stdin_of["sftq-tick-secret"] == TICK_SECRET
    logins = {c["argv"][3]: c["stdin"] for c in r.calls if c["argv"][1:3] == ["db", "login-role"]}
    assert logins == {"sftq_api_login": API_DB_PASSWORD, "sftq_analyst_login": ANALYST_DB_PASSWORD,
                      "sftq_scheduler_login": SCHEDULER_DB_PASSWORD}
    for c in r.calls:
        if c["argv"][0] == "sftq":
            assert c["env"]["DATABASE_URL"] == SETTINGS["SUPABASE_DB_URL"]
        if c["argv"][0] == "psql":
            assert c["env"]["PGPASSWORD"] == DB_PASSWORD
    schedule = next(c for c in r.calls if "cron/schedule_tick.sql" in c["argv"])
    assert schedule["stdin"] == TICK_SECRET
    webhooks_cron = next(c for c in r.calls if "cron/schedule_webhooks.sql" in c["argv"])
    assert webhooks_cron["stdin"] == TICK_SECRET
    assert stdin_of["sftq-webhooks-key"] == WEBHOOKS_KEY
    assert all(c["env"].get("SFTQ_SQL_DIR") == "sql" for c in r.calls
               if c["argv"][:3] == ["sftq", "db", "migrate"])
    # No secret on any command line.
    for c in r.calls:
        assert mask(" ".join(c["argv"])) == " ".join(c["argv"]), c["argv"]


# ---- services (the container image) -------------------------------------------------------

def test_services_dry_run(deploy: Runner, tmp_path: Path) -> None:
    build = tmp_path / "build"
    env = SETTINGS | {"SFTQ_BUILD_DIR": str(build), "SFTQ_IMAGE_TAG": "v42",
                      "GCP_SERVICE_ACCOUNT": SA}
    r = deploy("--dry-run", "services", env=env)
    assert r.code == 0, r.stderr
    image = "europe-west1-docker.pkg.dev/sftq-prod/sftq/sftq:v42"
    common = (f"--project=sftq-prod --region=europe-west1 --image={image} --port=8080 --cpu=2 "
              "--memory=1Gi --concurrency=16")
    small = f"--project=sftq-prod --region=europe-west1 --image={image} --port=8080 --cpu=1 " \
        "--memory=512Mi"
    assert r.lines == [
        "gcloud artifacts repositories describe sftq --project=sftq-prod --location=europe-west1 "
        "--quiet >/dev/null 2>&1 || gcloud artifacts repositories create sftq --project=sftq-prod "
        "--location=europe-west1 --repository-format=docker --quiet",
        f"gcloud builds submit {build}/image --project=sftq-prod --region=europe-west1 "
        f"--tag={image} --quiet",
        f"gcloud run deploy sftq-jobs-api {common} --timeout=60s --allow-unauthenticated "
        f"--service-account={SA} --set-env-vars=FIREWORKS_ACCOUNT_ID=acme "
        "--set-secrets=DATABASE_URL=sftq-api-database-url:latest,"
        "FIREWORKS_API_KEY=sftq-fireworks-api-key:latest,"
        "SFTQ_WEBHOOKS_KEY=sftq-webhooks-key:latest --quiet",
        f"gcloud run deploy sftq-analytics {common} --timeout=60s --allow-unauthenticated "
        f"--service-account={SA} --clear-env-vars "
        "--set-secrets=DATABASE_URL=sftq-analytics-database-url:latest --quiet",
        f"gcloud run deploy sftq-scheduler-tick {common} --timeout=110s --allow-unauthenticated "
        f"--service-account={SA} --set-env-vars=FIREWORKS_ACCOUNT_ID=acme "
        "--set-secrets=DATABASE_URL=sftq-database-url:latest,"
        "FIREWORKS_API_KEY=sftq-fireworks-api-key:latest,"
        "SFTQ_TICK_SECRET=sftq-tick-secret:latest --quiet",
        # The same image, each with a server command of its own (test_container.py runs both).
        f"gcloud run deploy sftq-webhook-deliver {small} --concurrency=4 --timeout=60s "
        "--command=granian --args=--interface,wsgi,--host,0.0.0.0,--port,8080,--workers,1,"
        "--blocking-threads,4,--no-ws,--factory,webhook_deliver:create_app "
        f"--allow-unauthenticated --service-account={SA} --clear-env-vars "
        "--set-secrets=DATABASE_URL=sftq-database-url:latest,"
        "SFTQ_TICK_SECRET=sftq-tick-secret:latest,"
        "SFTQ_WEBHOOKS_KEY=sftq-webhooks-key:latest --quiet",
        f"gcloud run deploy sftq-jobs-stream {small} --concurrency=1000 --timeout=3600s "
        "--command=uvicorn --args=jobs_stream:asgi_app,--factory,--host,0.0.0.0,--port,8080,"
        "--no-access-log,--ws,none,--lifespan,on,--timeout-graceful-shutdown,8 "
        f"--allow-unauthenticated --service-account={SA} --clear-env-vars "
        "--set-secrets=DATABASE_URL=sftq-api-database-url:latest --quiet",
    ]
    assert r.calls == []
    staged = build / "image"
    files = {str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()}
    assert {"Dockerfile", ".dockerignore", "pyproject.toml", "constraints.txt",
            "docs/openapi.json", "functions/sftq_server/http/gateway.py",
            "functions/sftq_server/scheduler/http.py", "functions/webhook_deliver.py",
            "functions/jobs_stream.py", "functions/sftq_server/stream/hub.py"} <= files
    assert not any("__pycache__" in f or f.startswith(("sql/", "tests/")) for f in files)
    assert (staged / "Dockerfile").read_bytes() == (ROOT / "Dockerfile").read_bytes()
    pins = {line for line in (staged / "constraints.txt").read_text().splitlines()
            if not line.startswith("#")}
    assert {f"{p}=={metadata.version(p)}" for p in ("psycopg", "psycopg-pool", "pydantic",
                                                     "httpx", "werkzeug", "granian", "uvicorn",
                                                     "cryptography")} <= pins
    assert not any("[" in pin for pin in pins)  # pip constraints take no extras
    r = deploy("--dry-run", "services", "--only", "analytics", env=env)
    assert r.code == 0 and sum("gcloud run deploy" in line for line in r.lines) == 1


def test_all_deploys_the_container_and_the_scheduler_login(deploy: Runner, tmp_path: Path) -> None:
    env = SETTINGS | {"SFTQ_BUILD_DIR": str(tmp_path / "build"), "SFTQ_IMAGE_TAG": "v1"}
    r = deploy("--dry-run", "all", env=env)
    assert r.code == 0, r.stderr
    text = "\n".join(r.lines)
    assert "sftq db login-role sftq_scheduler_login --member-of sftq_scheduler" in text
    assert "gcloud builds submit" in text and "gcloud run deploy sftq-scheduler-tick" in text
    assert "gcloud functions deploy" not in text
    assert "sftq_scheduler_login.abcdefgh:***@" in text  # scheduler-tick's DATABASE_URL
    assert "postgres.abcdefgh:***@" not in text  # the owner's pooler URL reaches no function


def test_secrets_never_show(deploy: Runner, tmp_path: Path) -> None:
    env = SETTINGS | {"SFTQ_ANALYST_DB_PASSWORD": ANALYST_DB_PASSWORD,
                      "SFTQ_BUILD_DIR": str(tmp_path / "build"),
                      "SFTQ_FUNCTIONS_DIR": str(_fake_functions_dir(tmp_path))}
    r = deploy("--dry-run", "all", env=env)
    assert r.code == 0, r.stderr
    text = r.stdout + r.stderr
    for secret in SECRETS:
        assert secret not in text
    assert "***" in r.stdout


def test_relative_paths_are_taken_from_where_it_was_run(deploy: Runner, tmp_path: Path) -> None:
    _fake_functions_dir(tmp_path)  # tmp_path is the working directory of every run
    env = SETTINGS | {"SFTQ_BUILD_DIR": "rel-build", "SFTQ_FUNCTIONS_DIR": "functions-src"}
    r = deploy("--dry-run", "functions", "--only", "analytics", env=env)
    assert r.code == 0, r.stderr
    assert f"--source={tmp_path}/rel-build/analytics " in r.stdout
    assert (tmp_path / "rel-build" / "analytics" / "functions" / "analytics_api.py").exists()
