"""The enqueue section's event-loop study (bench/rsgi_jobs.py under granian's RSGI interface)
answers POST /jobs as the jobs-api does, so its row measures the same work: a 201 with the
job's body and Location, the job stored, and the jobs-api's error envelope for a bad key."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import sec_enqueue  # noqa: E402
import servers  # noqa: E402


def test_the_event_loop_study_answers_post_jobs_like_the_jobs_api(db_url: str,
                                                                  tmp_path: Path) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT sftq.create_user('alice')")
        key = conn.execute("SELECT key FROM sftq.issue_key('alice')").fetchone()[0]
    server = servers.start(sec_enqueue.RSGI_STUDY, db_url, tmp_path)
    try:
        base = f"http://127.0.0.1:{server.port}"
        ok = httpx.post(f"{base}/jobs", content=sec_enqueue.BODY, timeout=10, headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        bad = httpx.post(f"{base}/jobs", content=sec_enqueue.BODY, timeout=10, headers={
            "Authorization": "Bearer sftq_notakey0000", "Content-Type": "application/json"})
    finally:
        server.stop()
    assert ok.status_code == 201, ok.text
    job = ok.json()
    assert job["state"] == "QUEUED" and job["kind"] == "SFT"
    assert ok.headers["location"] == f"/jobs/{job['id']}"
    with psycopg.connect(db_url) as conn:
        stored = conn.execute("SELECT gpu_count, fireworks_payload FROM sftq.jobs WHERE id = %s",
                              (job["id"],)).fetchone()
    assert stored is not None and stored[0] == 4
    assert stored[1] == json.loads(sec_enqueue.BODY)["fireworks_payload"]
    assert bad.status_code == 401 and bad.json()["code"] == "unauthorized", bad.text
