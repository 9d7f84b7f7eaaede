"""Shared by the infra tests: run infra/deploy.sh in a clean environment, with stand-ins
for gcloud, psql and sftq first on PATH that record each call instead of doing anything.
Nothing here reaches a cloud: dry runs print, and real runs reach only the stand-ins (or,
in test_deploy_db.py, the private PostgreSQL cluster on loopback)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "infra" / "deploy.sh"

# Fake but realistic settings. Every secret is distinct and long enough to mask safely.
DB_PASSWORD = "direct-db-pass-8f2k"
POOLER_PASSWORD = "pooler-pass-77Qx"
API_DB_PASSWORD = "api p@ss:w/rd#0123456789"  # needs percent-encoding inside a URL
ANALYST_DB_PASSWORD = "analyst-pass-'quoted'-1234"
FIREWORKS_KEY = "fw_fake_key_5d41402abc4b2a76"
TICK_SECRET = "tick-secret-e99a18c428cb38d5-0123456789"
SCHEDULER_DB_PASSWORD = "scheduler-pass-0123456789"
ACCESS_TOKEN = "sbp_fake_token_0123456789abcdef"

SETTINGS: dict[str, str] = {
    "SUPABASE_DB_URL": f"postgresql://postgres:{DB_PASSWORD}@db.abcdefgh.supabase.co:5432/postgres",
    "SUPABASE_POOLER_URL": (f"postgresql://postgres.abcdefgh:{POOLER_PASSWORD}"
                            "@aws-0-eu-west-1.pooler.supabase.com:6543/postgres"),
    "SFTQ_API_DB_PASSWORD": API_DB_PASSWORD,
    "SFTQ_SCHEDULER_DB_PASSWORD": SCHEDULER_DB_PASSWORD,
    "FIREWORKS_API_KEY": FIREWORKS_KEY,
    "FIREWORKS_ACCOUNT_ID": "acme",
    "SFTQ_TICK_SECRET": TICK_SECRET,
    "GCP_PROJECT": "sftq-prod",
    "GCP_REGION": "europe-west1",
}
API_DB_PASSWORD_IN_URL = "api%20p%40ss%3Aw%2Frd%230123456789"
SECRETS = (DB_PASSWORD, POOLER_PASSWORD, API_DB_PASSWORD, API_DB_PASSWORD_IN_URL,
           ANALYST_DB_PASSWORD, FIREWORKS_KEY, TICK_SECRET, SCHEDULER_DB_PASSWORD, ACCESS_TOKEN)
# What a child may find in its environment (never on its command line).
ENV_NAMES = ("DATABASE_URL", "PGPASSWORD", "SFTQ_SQL_DIR")

FAKE_TOOL = """#!{python}
# Stand-in for {name}: records the call (argv, stdin, and the variables a child may get
# through its environment) and succeeds, except `gcloud secrets describe` of a secret named
# in FAKE_MISSING_SECRETS, which fails as if it did not exist; curl answers FAKE_CURL_ANSWER.
import json, os, sys
name = os.path.basename(sys.argv[0])
data = sys.stdin.read() if not sys.stdin.isatty() else ""
names = ("DATABASE_URL", "PGPASSWORD", "SFTQ_SQL_DIR")
env = {{k: os.environ[k] for k in names if k in os.environ}}
with open(os.environ["FAKE_LOG"], "a", encoding="utf-8") as f:
    f.write(json.dumps({{"argv": [name, *sys.argv[1:]], "stdin": data, "env": env}}) + "\\n")
missing = os.environ.get("FAKE_MISSING_SECRETS", "").split(",")
if name == "gcloud" and sys.argv[1:3] == ["secrets", "describe"] and sys.argv[3] in missing:
    sys.exit(1)
if name == "curl":
    print(os.environ.get("FAKE_CURL_ANSWER", "{{}}"))
"""


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    calls: list[dict[str, Any]]

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines()


Runner = Callable[..., Result]


def mask(text: str) -> str:
    for secret in sorted(SECRETS, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def printed_commands(line: str) -> list[tuple[list[str], str | None, dict[str, str]]]:
    """The commands one printed line runs, each with what it gets on stdin (or None) and in
    its environment: `[NAME=V ...] A`, `printf %s VALUE | [NAME=V ...] A`, or
    `A >/dev/null 2>&1 || B`."""
    words = shlex.split(line)
    segments: list[list[str]] = [[]]
    for w in words:
        if w in ("|", "||"):
            segments.append([])
        elif w not in (">/dev/null", "2>&1"):
            segments[-1].append(w)

    def split_env(seg: list[str]) -> tuple[list[str], dict[str, str]]:
        seg, env = list(seg), {}
        while seg and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", seg[0], re.S):
            name, _, value = seg.pop(0).partition("=")
            env[name] = value
        return seg, env

    if "|" in words:
        (printf, fmt, value), piped = segments
        assert (printf, fmt) == ("printf", "%s")
        cmd, env = split_env(piped)
        return [(cmd, value, env)]
    out: list[tuple[list[str], str | None, dict[str, str]]] = []
    for seg in segments:
        cmd, env = split_env(seg)
        out.append((cmd, None, env))
    return out


# ---- SQL blocks in the docs and a small data set to run them on ---------------------------

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)
WANDB_SECRET = "wandb-SECRET-3f1c"


def sql_blocks(doc: Path) -> list[tuple[str, str]]:
    """(info string, body) of every fenced block whose info string starts with `sql`."""
    return [(info.strip(), body) for info, body in _FENCE.findall(doc.read_text(encoding="utf-8"))
            if info.strip().split(" ")[0] == "sql"]


def seed(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """A little of everything, through the procedures: queued, running, succeeded, failed
    (rejected at submission and failed while running), cancelled, a submission stuck on a
    429, and two ticks, one with an error. Returns the ids by name."""

    def one(sql: str, *params: Any) -> Any:
        row = conn.execute(sql, params).fetchone()
        assert row is not None
        return row[0]

    payload = {"dataset": "accounts/acme/datasets/chat",
               "baseModel": "accounts/fireworks/models/m-8b",
               "wandbConfig": {"enabled": True, "apiKey": WANDB_SECRET}}

    def enqueue(user: int, kind: str, gpus: int, name: str) -> Any:
        return one("SELECT id FROM sftq.enqueue(%s, %s, %s::jsonb, %s, %s)",
                   user, kind, json.dumps(payload), name, gpus)

    ana, bo, cy = (one("SELECT sftq.create_user(%s, %s)", n, cap)
                   for n, cap in (("ana", 1), ("bo", 2), ("cy", 1)))
    ids: dict[str, Any] = {}
    ids["ana1"] = enqueue(ana, "SFT", 4, "ana first")
    ids["ana2"] = enqueue(ana, "SFT", 4, "ana second")
    ids["bo_dpo"] = enqueue(bo, "DPO", 8, "bo dpo")
    ids["bo_rft"] = enqueue(bo, "RFT", 4, "bo rft")
    ids["cy1"] = enqueue(cy, "SFT", 4, "cy first")
    # Budget 16: ana1 (4), bo_dpo (8), cy1 (4); ana2 waits behind ana1, bo_rft for the next round.
    conn.execute("SELECT sftq.admit_for_quota(16, 0)")
    conn.execute("SELECT sftq.record_submitted(%s, 'accounts/acme/supervisedFineTuningJobs/a1')",
                 (ids["ana1"],))
    conn.execute("SELECT sftq.record_provider_state(%s, 'JOB_STATE_COMPLETED', NULL)",
                 (ids["ana1"],))
    conn.execute("SELECT sftq.record_submit_error(%s, %s, false)",
                 (ids["bo_dpo"], 'HTTP 400: {"error": {"message": "dataset not found"}}'))
    conn.execute("SELECT sftq.record_submitted(%s, 'accounts/acme/supervisedFineTuningJobs/c1')",
                 (ids["cy1"],))
    conn.execute("SELECT sftq.record_provider_state(%s, 'JOB_STATE_FAILED', 'out of memory')",
                 (ids["cy1"],))
    conn.execute("SELECT sftq.admit_for_quota(16, 4)")  # ana2 and bo_rft
    conn.execute("SELECT sftq.record_submit_error(%s, %s, true)",
                 (ids["bo_rft"], "submit: HTTP 429: too many requests"))
    ids["cy2"] = enqueue(cy, "DPO", 4, "cy cancelled")
    conn.execute("SELECT * FROM sftq.cancel(%s, %s)", (cy, ids["cy2"]))
    ids["ana3"] = enqueue(ana, "RFT", 8, "ana third")
    ids["cy3"] = enqueue(cy, "SFT", 4, "cy queued")
    for result in ({"quota_limit": 16, "quota_usage": 4, "budget": 12, "admitted": 3},
                   {"quota_limit": 16, "quota_usage": 12, "budget": 4, "admitted": 2,
                    "errors": [f"submit {ids['bo_rft']}: HTTP 429: too many requests"]}):
        tick = one("SELECT sftq.tick_begin('test-host:1')")
        conn.execute("SELECT sftq.tick_finish(%s, %s::jsonb)", (tick, json.dumps(result)))
    return ids
