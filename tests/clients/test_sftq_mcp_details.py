"""The MCP server's own argument errors name where each problem is with `path`, as the API's
400 details do (issue 54.13); `field` stays for callers that read it."""

from __future__ import annotations

import asyncio

import pytest

from sftq_client import AsyncClient
from sftq_client.mcp.tools import ToolError, call_tool


def test_invalid_arguments_details_carry_a_path() -> None:
    async def go() -> ToolError:
        async with AsyncClient("sftq_" + "a" * 40, "http://127.0.0.1:9/functions/v1/jobs-api") \
                as client:
            with pytest.raises(ToolError) as caught:
                await call_tool(client, "submit_job", {"kind": "SFT", "gpu_count": 0})
            return caught.value

    error = asyncio.run(go())
    assert error.code == "invalid_arguments"
    assert isinstance(error.details, list) and error.details
    assert all(d["path"] == d["field"] and d["message"] for d in error.details)
    assert {"gpu_count", "fireworks_payload"} <= {d["path"] for d in error.details}
