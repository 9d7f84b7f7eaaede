# ruff: noqa: E501  (the contract's lines are copied verbatim, long ones included)
"""Through a real server on loopback: the gateway in its own process (`python -m
sftq_server.http.gateway`), every curl line of the contract run verbatim with bash, and the
contract's Python snippet, then a clean exit on SIGTERM.

The snippets below are copied verbatim from the contract; only `<id>` / `<job_id>` are
substituted, and `$job_id`, `$SUPABASE_URL`, `$SFTQ_API_KEY` come from the environment.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fn_support import Db

ROOT = Path(__file__).resolve().parents[2]

JOB_KEYS = {"id", "kind", "state", "display_name", "gpu_count", "created_at", "started_at",
            "completed_at", "error", "fireworks_job_name",
            # Added since the contract (new fields are only added): issue 10.
            "failure_class", "retry_of", "warnings", "estimated_cost",
            # Issue 53: pipelines and run limits.
            "after", "max_run_seconds", "stalled", "stalled_since"}

# --- verbatim from the contract -------------------------------------------------------------

# Enqueue a job: a template (its payload is a /* comment */, so not JSON as written).
ENQUEUE_TEMPLATE = r"""curl -sS -X POST "$SUPABASE_URL/functions/v1/jobs-api/jobs" \
  -H "Authorization: Bearer $SFTQ_API_KEY" \
  -H "Content-Type: application/json" \
  -d '{
    "kind": "SFT",
    "display_name": "<human-readable name>",
    "gpu_count": 4,
    "fireworks_payload": { /* the exact body you would have sent to Fireworks */ }
  }'"""
# List your jobs, and the two filters.
LIST_ALL = r'''curl -sS -H "Authorization: Bearer $SFTQ_API_KEY" "$SUPABASE_URL/functions/v1/jobs-api/jobs"'''
LIST_PROGRESS = r'''curl -sS -H "Authorization: Bearer $SFTQ_API_KEY" "$SUPABASE_URL/functions/v1/jobs-api/jobs?state=PROGRESS"'''
LIST_DPO = r'''curl -sS -H "Authorization: Bearer $SFTQ_API_KEY" "$SUPABASE_URL/functions/v1/jobs-api/jobs?kind=DPO"'''
# Status of one job.
GET_ONE = r'''curl -sS -H "Authorization: Bearer $SFTQ_API_KEY" "$SUPABASE_URL/functions/v1/jobs-api/jobs/<id>"'''
# Cancel a job.
CANCEL = r'''curl -sS -X DELETE -H "Authorization: Bearer $SFTQ_API_KEY" "$SUPABASE_URL/functions/v1/jobs-api/jobs/<id>"'''
# Typical patterns: fire and forget, then poll until terminal.
FIRE_AND_FORGET = r'''resp=$(curl -sS -X POST "$SUPABASE_URL/functions/v1/jobs-api/jobs" \
  -H "Authorization: Bearer $SFTQ_API_KEY" -H "Content-Type: application/json" \
  -d "$(cat <<'JSON'
{
  "kind": "SFT",
  "display_name": "qwen3-14b baseline",
  "gpu_count": 4,
  "fireworks_payload": {
    "baseModel": "accounts/fireworks/models/qwen3-14b",
    "dataset": "accounts/trilogy/datasets/edullm-ela-sft-v3-thinking",
    "displayName": "qwen3-14b baseline",
    "outputModel": "accounts/trilogy/models/edullm-ela-qwen3-14b-baseline-v1",
    "evaluationDataset": "accounts/trilogy/datasets/edullm-ela-sft-val-v2",
    "epochs": 3,
    "learningRate": 0.0002,
    "loraRank": 32,
    "maxContextLength": 8192,
    "learningRateWarmupSteps": 10,
    "batchSize": 65536,
    "gradientAccumulationSteps": 1
  }
}
JSON
)")
job_id=$(echo "$resp" | python3 -c 'import sys,json;print(json.load(sys.stdin)["id"])')
echo "enqueued: $job_id"'''
POLL = r"""while true; do
  state=$(curl -sS -H "Authorization: Bearer $SFTQ_API_KEY" \
    "$SUPABASE_URL/functions/v1/jobs-api/jobs/$job_id" \
    | python3 -c 'import sys,json;print(json.load(sys.stdin)["state"])')
  echo "$(date -Iseconds) $state"
  case "$state" in SUCCESS|FAIL|CANCELLED) break;; esac
  sleep 60
done"""
# Analytics (each appears twice in the contract, identically but for <id>/<job_id>).
QUEUE_1 = r'''curl -sS -H "Authorization: Bearer $SFTQ_API_KEY" \
  "$SUPABASE_URL/functions/v1/jobs-api/jobs/analytics/queue"'''
SUMMARY_1 = r'''curl -sS -H "Authorization: Bearer $SFTQ_API_KEY" \
  "$SUPABASE_URL/functions/v1/jobs-api/jobs/analytics/summary"'''
JOB_ANALYTICS_1 = r'''curl -sS -H "Authorization: Bearer $SFTQ_API_KEY" \
  "$SUPABASE_URL/functions/v1/jobs-api/jobs/<id>/analytics"'''
QUEUE_2 = r'''curl -sS -H "Authorization: Bearer $SFTQ_API_KEY" \
  "$SUPABASE_URL/functions/v1/jobs-api/jobs/analytics/queue"'''
SUMMARY_2 = r'''curl -sS -H "Authorization: Bearer $SFTQ_API_KEY" \
  "$SUPABASE_URL/functions/v1/jobs-api/jobs/analytics/summary"'''
JOB_ANALYTICS_2 = r'''curl -sS -H "Authorization: Bearer $SFTQ_API_KEY" \
  "$SUPABASE_URL/functions/v1/jobs-api/jobs/<job_id>/analytics"'''
# The Python helper functions.
PYTHON_SNIPPET = r"""import os, json, urllib.request

BASE = f"{os.environ['SUPABASE_URL'].rstrip('/')}/functions/v1/jobs-api"
H = {"Authorization": f"Bearer {os.environ['SFTQ_API_KEY']}", "Content-Type": "application/json"}

def _req(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(BASE + path, data=data, headers=H, method=method)
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())

def enqueue(kind, fireworks_payload, *, display_name=None, gpu_count=4):
    body = {"kind": kind, "fireworks_payload": fireworks_payload, "gpu_count": gpu_count}
    if display_name: body["display_name"] = display_name
    return _req("POST", "/jobs", body)

def status(job_id):      return _req("GET",    f"/jobs/{job_id}")
def list_jobs(**q):      return _req("GET",    "/jobs" + ("?" + "&".join(f"{k}={v}" for k,v in q.items()) if q else ""))
def cancel(job_id):      return _req("DELETE", f"/jobs/{job_id}")

def queue_context():         return _req("GET", "/jobs/analytics/queue")
def summary():               return _req("GET", "/jobs/analytics/summary")
def job_analytics(job_id):   return _req("GET", f"/jobs/{job_id}/analytics")"""

# --- the live gateway -----------------------------------------------------------------------


@dataclass
class Live:
    url: str
    proc: subprocess.Popen[str]
    key: str

    def bash(self, script: str, *, key: str | None = None, **env: str) -> str:
        """Run a contract snippet with bash; answer its stdout (stderr must be empty)."""
        full_env = {**os.environ, "SUPABASE_URL": self.url,
                    "SFTQ_API_KEY": key if key is not None else self.key, **env}
        done = subprocess.run(["bash", "-c", script], env=full_env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        assert done.stderr == "", done.stderr
        return done.stdout

    def json(self, script: str, **kw: Any) -> Any:
        return json.loads(self.bash(script, **kw))


def _read_first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        proc.kill()
        raise AssertionError("the gateway did not start") from None


@pytest.fixture
def live(db_url: str, db: Db, alice: str) -> Iterator[Live]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FIREWORKS_", "ANALYTICS_"))}
    env |= {"DATABASE_URL": db_url, "PYTHONPATH": str(ROOT / "functions"),
            "SFTQ_DB_TIMEOUT_SECONDS": "2", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sftq_server.http.gateway", "--host", "127.0.0.1", "--port", "0"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = _read_first_line(proc, 60)
        match = re.fullmatch(r"gateway listening on (http://127\.0\.0\.1:\d+)\n", first)
        assert match, first
        yield Live(match.group(1), proc, alice)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError("the gateway did not stop on SIGTERM") from None
    # A clean exit on SIGTERM, one JSON access line per request, no key in the log.
    assert proc.returncode == 0, err
    assert out.strip().endswith("gateway stopped")
    access = [json.loads(line) for line in err.splitlines() if line.startswith('{"fn"')]
    assert access, err
    assert alice not in err


def with_id(snippet: str, job_id: str) -> str:
    return snippet.replace("<job_id>", job_id).replace("<id>", job_id)


def test_every_contract_curl_line_answers_what_the_contract_says(live: Live, db: Db) -> None:
    # The enqueue template as printed is not JSON (its payload is a comment): a clear 400.
    err = live.json(ENQUEUE_TEMPLATE)
    assert err["code"] == "invalid_json" and err["error"].startswith("request body is not valid JSON")
    # Filled in, the same line enqueues.
    filled = ENQUEUE_TEMPLATE.replace("{ /* the exact body you would have sent to Fireworks */ }",
                                      '{"dataset": "accounts/trilogy/datasets/d"}')
    first = live.json(filled)
    assert set(first) == {"id", "kind", "state", "created_at"}
    assert first["kind"] == "SFT" and first["state"] == "QUEUED"

    out = live.bash(FIRE_AND_FORGET)
    match = re.fullmatch(r"enqueued: ([0-9a-f-]{36})\n", out)
    assert match, out
    second = match.group(1)
    uuid.UUID(second)

    jobs = live.json(LIST_ALL)
    assert [j["id"] for j in jobs] == [second, first["id"]]
    assert all(set(j) == JOB_KEYS for j in jobs)
    assert jobs[0]["display_name"] == "qwen3-14b baseline" and jobs[0]["gpu_count"] == 4
    assert jobs[1]["display_name"] == "<human-readable name>"

    assert live.json(LIST_PROGRESS) == []
    assert db.admit() == [first["id"]]
    name = db.submitted(first["id"])
    [running] = live.json(LIST_PROGRESS)
    assert running["id"] == first["id"] and running["state"] == "PROGRESS"
    assert running["fireworks_job_name"] == name and running["started_at"] is not None

    assert live.json(LIST_DPO) == []
    dpo = live.json(filled.replace('"kind": "SFT"', '"kind": "DPO"'))
    assert [j["id"] for j in live.json(LIST_DPO)] == [dpo["id"]]

    job = live.json(with_id(GET_ONE, second))
    assert set(job) == JOB_KEYS and job["id"] == second and job["state"] == "QUEUED"
    missing = live.json(with_id(GET_ONE, str(uuid.uuid4())))
    assert missing == {"error": "job not found", "code": "not_found"}

    for snippet in (QUEUE_1, QUEUE_2):
        ctx = live.json(snippet)
        assert set(ctx) == {"your_progress_job", "your_queued_jobs", "global_queue_depth",
                            "global_progress_count", "global_gpu_in_use"}
        assert ctx["your_progress_job"]["id"] == first["id"]
        assert [q["id"] for q in ctx["your_queued_jobs"]] == [second, dpo["id"]]
        assert ctx["global_progress_count"] == 1 and ctx["global_gpu_in_use"] == 4
    for snippet in (SUMMARY_1, SUMMARY_2):
        summary = live.json(snippet)
        assert summary["total"] == 3 and summary["success_rate"] is None
        assert summary["by_state"] == {"QUEUED": 2, "PROGRESS": 1, "SUCCESS": 0, "FAIL": 0,
                                       "CANCELLED": 0}
        assert summary["by_kind"] == {"SFT": 2, "DPO": 1, "RFT": 0}
    for snippet in (JOB_ANALYTICS_1, JOB_ANALYTICS_2):
        detail = live.json(with_id(snippet, first["id"]))
        assert detail["id"] == first["id"] and detail["state"] == "PROGRESS"
        assert set(detail["timeline"]) == {"queued_at", "started_at", "completed_at"}
        assert detail["run_duration_seconds"] is None and detail["gpu_hours"] is None

    # Cancel: QUEUED flips at once; a second cancel is a 409.
    cancelled = live.json(with_id(CANCEL, second))
    assert cancelled["id"] == second and cancelled["state"] == "CANCELLED"
    again = live.json(with_id(CANCEL, second))
    assert again["code"] == "job_terminal"

    # The poll loop ends at once on a terminal job.
    lines = live.bash(POLL, job_id=second).splitlines()
    assert len(lines) == 1 and lines[0].endswith(" CANCELLED"), lines

    # Troubleshooting: a wrong or missing key is a 401 "unauthorized".
    assert live.json(LIST_ALL, key="sftq_" + "0" * 48)["code"] == "unauthorized"
    assert live.json(LIST_ALL, key="")["code"] == "unauthorized"


def test_the_contract_python_snippet_works(live: Live) -> None:
    driver = PYTHON_SNIPPET + "\n\n" + '''
job = enqueue("RFT", {"dataset": "d", "evaluator": "e"}, display_name="py run", gpu_count=2)
out = {"job": job, "status": status(job["id"]), "listed": list_jobs(state="QUEUED", kind="RFT"),
       "queue": queue_context(), "summary": summary(), "analytics": job_analytics(job["id"]),
       "cancel": cancel(job["id"])}
print(json.dumps(out))
'''
    env = {**os.environ, "SUPABASE_URL": live.url + "/", "SFTQ_API_KEY": live.key}
    done = subprocess.run([sys.executable, "-c", driver], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    job = out["job"]
    assert set(job) == {"id", "kind", "state", "created_at"} and job["kind"] == "RFT"
    assert out["status"]["display_name"] == "py run" and out["status"]["gpu_count"] == 2
    assert [j["id"] for j in out["listed"]] == [job["id"]]
    assert out["queue"]["your_queued_jobs"][0]["id"] == job["id"]
    assert out["summary"]["by_kind"]["RFT"] == 1
    assert out["analytics"]["timeline"]["started_at"] is None
    assert out["cancel"]["state"] == "CANCELLED"
