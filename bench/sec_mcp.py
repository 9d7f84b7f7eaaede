"""MCP: what a tool call over Streamable HTTP costs on top of the plain API call it makes.

The gateway the image runs (granian RSGI, sftq_server.http.gateway_rsgi) on one database, one
user, one job. In alternating rounds on one keep-alive connection each: a plain
`GET /functions/v1/jobs-api/jobs/{id}`, and a `tools/call get_job` POSTed to
`/functions/v1/mcp` (stateless: one POST per call, as an MCP client sends it after its
`initialize`), read to its end (the result arrives as one SSE event). Alternating rounds
expose both to the same moments of the machine; the ratio of the medians is the figure.

The MCP call does the plain call's work (jobs-api checks the key, reads the job) in-process
and adds the protocol: JSON-RPC parsing, the transport's per-request session, validation of
the arguments, the SSE framing of the answer.
"""

from __future__ import annotations

import json
import os
import time

import httpx
import psycopg
import servers
from common import BENCH, FUNCTIONS, ROOT, Bench, percentile

SECTION = "mcp"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _user_key(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT sftq.create_user('bench-mcp')")
        row = conn.execute("SELECT key FROM sftq.issue_key('bench-mcp')").fetchone()
        assert row is not None
        return str(row[0])


def run(b: Bench) -> None:
    rounds = 150 if b.quick else 2000
    dbname = "bench_mcp"
    url = b.new_db(dbname)
    key = _user_key(url)
    # The MCP endpoint serves sftq_client's tools: the checkout's clients/ on the path too (the
    # image has the package installed).
    path = os.pathsep.join([str(BENCH / "site"), str(FUNCTIONS), str(BENCH), str(ROOT / "clients")])
    spec = servers.ServerSpec("gateway for mcp (image)", "image", workers=1,
                              extra_env={"PYTHONPATH": path})
    server = servers.start(spec, url, b.out_dir / "logs")
    try:
        base = f"http://127.0.0.1:{server.port}/functions/v1"
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(timeout=30, headers=auth) as api, \
                httpx.Client(timeout=30, headers=auth | ACCEPT) as mcp:
            r = api.post(f"{base}/jobs-api/jobs", json={
                "kind": "SFT", "gpu_count": 4, "fireworks_payload": {
                    "baseModel": "accounts/fireworks/models/qwen3-14b",
                    "dataset": "accounts/demo/datasets/bench-mcp"}})
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "bench", "version": "0"}}}
            r = mcp.post(f"{base}/mcp", json=init)
            assert r.status_code == 200, r.text
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "get_job", "arguments": {"job_id": job_id}}}).encode()

            def plain() -> None:
                resp = api.get(f"{base}/jobs-api/jobs/{job_id}")
                assert resp.status_code == 200

            def tool() -> None:
                resp = mcp.post(f"{base}/mcp", content=body)
                assert resp.status_code == 200 and job_id in resp.text, resp.text[:300]
                assert '"isError":false' in resp.text, resp.text[:300]

            for _ in range(max(10, rounds // 20)):  # warm both paths (lazy loads, pools)
                plain()
                tool()
            times: dict[str, list[float]] = {"plain": [], "mcp": []}
            for _ in range(rounds):
                for name, fn in (("plain", plain), ("mcp", tool)):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append((time.perf_counter() - t0) * 1000)
    finally:
        server.stop()
        b.drop_db(dbname)
    p50 = {k: percentile(v, 50) for k, v in times.items()}
    p95 = {k: percentile(v, 95) for k, v in times.items()}
    ratio = p50["mcp"] / p50["plain"]
    b.data[SECTION] = {"rounds": rounds, "p50_ms": p50, "p95_ms": p95, "ratio": ratio}
    b.add(SECTION, "GET /jobs/{id}, plain HTTP, p50", p50["plain"], "ms",
          note=f"p95 {p95['plain']:.2f}; {rounds} rounds, alternating with the MCP call")
    b.add(SECTION, "get_job over HTTP MCP (tools/call), p50", p50["mcp"], "ms",
          note=f"p95 {p95['mcp']:.2f}")
    b.add(SECTION, "MCP tool call / plain GET /jobs/{id}", ratio, "x", goal="< 2",
          ok=ratio < 2, note="same run, same server (the image's gateway)")
