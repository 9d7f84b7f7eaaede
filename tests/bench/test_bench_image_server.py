"""The enqueue section's recommended server is the image's command (Dockerfile CMD): granian
RSGI serving the whole gateway. Its rows must measure the same work as the deployment: a 201
with the job's body at the contract's path, the job stored, the access log on or off as the
row says, and the jobs-api's error envelope for a bad key."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import httpx
import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import sec_enqueue  # noqa: E402
import servers  # noqa: E402


def test_the_recommended_server_is_the_images_command() -> None:
    spec = sec_enqueue.recommended_spec()
    assert spec is not None and spec.kind == "image"
    assert spec.path == "/functions/v1/jobs-api/jobs"
    sys.path.insert(0, str(ROOT / "tests" / "infra"))
    from test_container import cmd

    image = cmd()
    assert image[image.index("--interface") + 1] == "rsgi"
    assert int(image[image.index("--workers") + 1]) == spec.workers
    assert image[-1] == "sftq_server.http.gateway_rsgi:create_app"


@pytest.mark.parametrize("access_log", [True, False])
def test_the_image_server_answers_post_jobs_as_the_contract_says(db_url: str, tmp_path: Path,
                                                                 access_log: bool) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT sftq.create_user('alice')")
        key = conn.execute("SELECT key FROM sftq.issue_key('alice')").fetchone()[0]
    rec = sec_enqueue.recommended_spec()
    assert rec is not None
    spec = dataclasses.replace(rec, access_log=access_log)
    server = servers.start(spec, db_url, tmp_path)
    try:
        url = f"http://127.0.0.1:{server.port}{spec.path}"
        ok = httpx.post(url, content=sec_enqueue.BODY, timeout=10, headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        bad = httpx.post(url, content=sec_enqueue.BODY, timeout=10, headers={
            "Authorization": "Bearer sftq_notakey0000", "Content-Type": "application/json"})
    finally:
        server.stop()
    assert ok.status_code == 201, ok.text
    job = ok.json()
    assert job["state"] == "QUEUED" and job["kind"] == "SFT"
    assert ok.headers["location"] == f"/functions/v1/jobs-api/jobs/{job['id']}"
    with psycopg.connect(db_url) as conn:
        stored = conn.execute("SELECT gpu_count, fireworks_payload FROM sftq.jobs WHERE id = %s",
                              (job["id"],)).fetchone()
    assert stored is not None and stored[0] == 4
    assert stored[1] == json.loads(sec_enqueue.BODY)["fireworks_payload"]
    assert bad.status_code == 401 and bad.json()["code"] == "unauthorized", bad.text
    log = server.log_path.read_text()
    lines = [json.loads(x) for x in log.splitlines() if x.startswith('{"fn"')]
    if access_log:
        # Two processes write their own lines: compare them in any order (with the probes').
        posts = sorted((x["route"], x["status"]) for x in lines if x["method"] == "POST")
        assert posts == [("/jobs", 201), ("/jobs", 401)], log
    else:
        assert lines == [], log
