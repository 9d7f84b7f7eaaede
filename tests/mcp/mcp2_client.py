"""An MCP client on the mcp package's 2.x line, run by tests/mcp/test_mcp_client_majors.py in a
virtualenv of its own (the project's venv keeps the server's mcp 1.x). It drives the server the
way a current agent does and prints what it saw as one JSON object on stdout.

    python mcp2_client.py http URL KEY
    python mcp2_client.py stdio '{"command": ..., "args": [...], "env": {...}}'
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import sys
import uuid
from typing import Any

import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

PAYLOAD = {"baseModel": "accounts/fireworks/models/qwen3-14b",
           "dataset": "accounts/demo/datasets/mcp-client2"}


def error_code(result: Any) -> str | None:
    if not result.is_error:
        return None
    code: str = json.loads(result.content[0].text)["error"]["code"]
    return code


async def drive(session: ClientSession) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    init = await session.initialize()
    seen["protocol_version"] = init.protocol_version
    seen["server"] = init.server_info.name
    seen["tools"] = sorted(t.name for t in (await session.list_tools()).tools)
    submitted = await session.call_tool("submit_job", {
        "kind": "sft", "fireworks_payload": PAYLOAD, "display_name": "mcp 2.x client",
        "gpu_count": 1, "idempotency_key": str(uuid.uuid4())})
    assert not submitted.is_error, submitted.content
    job = submitted.structured_content
    seen["submitted"] = {"kind": job["kind"], "state": job["state"]}
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    waited = await session.call_tool("wait_for_job", {
        "job_id": job["id"], "timeout_seconds": 1.0, "poll_interval_seconds": 0.2},
        progress_callback=on_progress)
    seen["waited"] = {"timed_out": waited.structured_content["timed_out"],
                      "progress": len(progress)}
    missing = await session.call_tool("get_job", {"job_id": str(uuid.uuid4())})
    seen["missing"] = error_code(missing)
    bad = await session.call_tool("get_job", {"job_id": 12})
    seen["bad_arguments"] = error_code(bad)
    cancelled = await session.call_tool("cancel_job", {"job_id": job["id"]})
    seen["cancelled"] = {"state": cancelled.structured_content["state"],
                         "pending": cancelled.structured_content["pending"]}
    again = await session.call_tool("cancel_job", {"job_id": job["id"]})
    seen["cancel_again"] = error_code(again)
    return seen


async def main(argv: list[str]) -> None:
    if argv[0] == "http":
        url, key = argv[1], argv[2]
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"},
                                  timeout=httpx2.Timeout(30, read=120))
        async with http, streamable_http_client(url, http_client=http) as (read, write), \
                ClientSession(read, write) as session:
            seen = await drive(session)
    else:
        server = StdioServerParameters(**json.loads(argv[1]))
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            seen = await drive(session)
    seen["client_version"] = importlib.metadata.version("mcp")
    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
