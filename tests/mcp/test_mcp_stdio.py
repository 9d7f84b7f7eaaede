"""`sftq mcp` over stdio, driven by the mcp package's own client (ClientSession + stdio_client)
against a live `sftq dev`: the tools and their schemas, submit, wait with progress, cancel,
events, resources with updated notifications, and errors as tool errors."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_support import clean_env

TOOL_NAMES = {"submit_job", "list_jobs", "get_job", "cancel_job", "retry_job", "job_events",
              "queue_position", "capacity", "wait_for_job"}
PAYLOAD = {"baseModel": "accounts/fireworks/models/qwen3-14b",
           "dataset": "accounts/demo/datasets/mcp-stdio"}


@asynccontextmanager
async def stdio_session(stack: Any, key: str | None = None,
                        on_message: Callable[[Any], Awaitable[None]] | None = None,
                        ) -> AsyncIterator[ClientSession]:
    env = clean_env(SUPABASE_URL=stack.base, SFTQ_API_KEY=key or stack.key)
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "sftq_client", "mcp", "--watch-interval", "0.3"],
                                   env=env)
    async with stdio_client(params) as (read, write), \
            ClientSession(read, write, message_handler=on_message) as session:
        await session.initialize()
        yield session


def error_of(result: types.CallToolResult) -> dict[str, Any]:
    assert result.isError, result
    assert result.content and isinstance(result.content[0], types.TextContent)
    error: dict[str, Any] = json.loads(result.content[0].text)["error"]
    return error


def ok(result: types.CallToolResult) -> dict[str, Any]:
    assert not result.isError, result.content
    assert result.structuredContent is not None
    return result.structuredContent


def test_tools_are_listed_with_schemas_and_rules(stack: Any) -> None:
    async def main() -> None:
        async with stdio_session(stack) as session:
            init_tools = (await session.list_tools()).tools
            assert {t.name for t in init_tools} == TOOL_NAMES
            for tool in init_tools:
                assert tool.outputSchema is not None and tool.outputSchema["type"] == "object"
                assert tool.inputSchema["type"] == "object"
                assert tool.description
            submit = next(t for t in init_tools if t.name == "submit_job")
            assert set(submit.inputSchema["properties"]) == {
                "kind", "fireworks_payload", "display_name", "gpu_count", "idempotency_key",
                "after"}
            assert set(submit.inputSchema["required"]) == {"kind", "fireworks_payload"}
            text = submit.description or ""
            for rule in ("one job at a time", "strict FIFO", "never call the Fireworks"):
                assert rule in text, rule
            listing = next(t for t in init_tools if t.name == "list_jobs")
            assert {"state", "kind", "limit"} <= set(listing.inputSchema["properties"])

    anyio.run(main)


def test_submit_wait_with_progress_and_finish(stack: Any) -> None:
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def main() -> None:
        async with stdio_session(stack) as session:
            key = f"mcp-{uuid.uuid4()}"
            job = ok(await session.call_tool("submit_job", {
                "kind": "SFT", "fireworks_payload": PAYLOAD, "display_name": "mcp stdio",
                "gpu_count": 4, "idempotency_key": key}))
            assert job["state"] == "QUEUED"
            # A wait that times out says so and returns the job as it is, on time.
            started = anyio.current_time()
            waited = ok(await session.call_tool(
                "wait_for_job", {"job_id": job["id"], "timeout_seconds": 1.0,
                                 "poll_interval_seconds": 0.2}, progress_callback=on_progress))
            assert anyio.current_time() - started < 3.0
            assert waited["timed_out"] is True and waited["terminal"] is False
            assert waited["job"]["state"] == "QUEUED"
            assert progress and all(total == 1.0 for _, total, _ in progress)
            assert "QUEUED" in (progress[-1][2] or "")
            progress.clear()

            async def finish() -> None:
                await anyio.sleep(0.5)
                await anyio.to_thread.run_sync(stack.tick)
                await anyio.to_thread.run_sync(stack.finish, job["id"])
                await anyio.to_thread.run_sync(stack.tick)

            async with anyio.create_task_group() as group:
                group.start_soon(finish)
                done = ok(await session.call_tool(
                    "wait_for_job", {"job_id": job["id"], "timeout_seconds": 60,
                                     "poll_interval_seconds": 0.2},
                    progress_callback=on_progress))
            assert done["terminal"] is True and done["timed_out"] is False
            assert done["job"]["state"] == "SUCCESS"
            states = [m for _, _, m in progress]
            assert any("PROGRESS" in (m or "") for m in states) or len(states) >= 2
            values = [v for v, _, _ in progress]
            assert values == sorted(values)
            # The same key answers the same job (a resubmission after a lost answer).
            again = ok(await session.call_tool("submit_job", {
                "kind": "SFT", "fireworks_payload": PAYLOAD, "display_name": "mcp stdio",
                "gpu_count": 4, "idempotency_key": key}))
            assert again["id"] == job["id"]
            got = ok(await session.call_tool("get_job", {"job_id": job["id"][:8]}))
            assert got["id"] == job["id"] and got["state"] == "SUCCESS"
            events = ok(await session.call_tool("job_events", {"job_id": job["id"]}))
            kinds = [e["type"] for e in events["events"]]
            assert kinds[0] == "queued" and "succeeded" in kinds

    anyio.run(main)


def test_cancel_events_queue_and_capacity(stack: Any) -> None:
    async def main() -> None:
        async with stdio_session(stack) as session:
            first = ok(await session.call_tool("submit_job", {
                "kind": "DPO", "fireworks_payload": PAYLOAD, "gpu_count": 2}))
            second = ok(await session.call_tool("submit_job", {
                "kind": "SFT", "fireworks_payload": PAYLOAD, "gpu_count": 2}))
            position = ok(await session.call_tool("queue_position", {"job_id": second["id"]}))
            queued = {j["id"]: j for j in position["queue"]["your_queued_jobs"]}
            assert second["id"] in queued and queued[second["id"]]["waiting_reason"]
            assert position["job"]["id"] == second["id"]
            cap = ok(await session.call_tool("capacity", {}))
            assert {"quota", "running", "queued", "users", "scheduler"} <= set(cap)
            listed = ok(await session.call_tool("list_jobs", {"state": "QUEUED", "limit": 50}))
            assert {first["id"], second["id"]} <= {j["id"] for j in listed["jobs"]}
            for job in (first, second):
                cancelled = ok(await session.call_tool("cancel_job", {"job_id": job["id"]}))
                assert cancelled["state"] == "CANCELLED" and cancelled["pending"] is False
            events = ok(await session.call_tool("job_events", {"job_id": first["id"]}))
            assert [e["type"] for e in events["events"]] == ["queued", "cancelled"]
            # Cancelling again is the API's 409, as a tool error with its code.
            error = error_of(await session.call_tool("cancel_job", {"job_id": first["id"]}))
            assert error["code"] == "job_terminal" and error["status"] == 409
            retried = ok(await session.call_tool("retry_job", {"job_id": first["id"]}))
            assert retried["retry_of"] == first["id"] and retried["state"] == "QUEUED"
            ok(await session.call_tool("cancel_job", {"job_id": retried["id"]}))

    anyio.run(main)


def test_hostile_inputs_are_tool_errors(stack: Any) -> None:
    async def main() -> None:
        async with stdio_session(stack) as session:
            cases: list[tuple[str, dict[str, Any], str]] = [
                ("get_job", {"job_id": str(uuid.uuid4())}, "not_found"),
                ("get_job", {"job_id": "../../webhooks"}, "not_found"),
                ("get_job", {"job_id": "x" * 5000}, "invalid_arguments"),
                ("get_job", {"job_id": "abc"}, "invalid_arguments"),
                ("get_job", {}, "invalid_arguments"),
                ("get_job", {"job_id": 12}, "invalid_arguments"),
                ("submit_job", {"kind": "PPO", "fireworks_payload": {}}, "invalid_arguments"),
                ("submit_job", {"kind": "SFT", "fireworks_payload": "{}"}, "invalid_arguments"),
                ("submit_job", {"kind": "SFT", "fireworks_payload": PAYLOAD, "gpu_count": "4"},
                 "invalid_arguments"),
                ("submit_job", {"kind": "SFT", "fireworks_payload": PAYLOAD, "gpus": 4},
                 "invalid_arguments"),
                ("submit_job", {"kind": "SFT", "fireworks_payload": {"blob": "x" * 1_200_000}},
                 "payload_too_large"),
                ("submit_job", {"kind": "SFT", "fireworks_payload": {"blob": "x" * 2_000_000}},
                 "payload_too_large"),  # as over HTTP (test_mcp_http.py)
                ("list_jobs", {"limit": 10_000}, "invalid_arguments"),
                ("wait_for_job", {"job_id": str(uuid.uuid4()), "timeout_seconds": 1e9},
                 "invalid_arguments"),
                ("no_such_tool", {}, "unknown_tool"),
            ]
            for name, arguments, code in cases:
                error = error_of(await session.call_tool(name, arguments))
                assert error["code"] == code, (name, arguments, error)
                assert error["message"]
            # The session is still fine after all of that.
            ok(await session.call_tool("list_jobs", {"limit": 1}))

    anyio.run(main)


def test_resources_and_updated_notifications(stack: Any) -> None:
    updated: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(
                message.root, types.ResourceUpdatedNotification):
            updated.append(str(message.root.params.uri))

    async def main() -> None:
        async with stdio_session(stack, on_message=on_message) as session:
            init = session.get_server_capabilities()
            assert init is not None and init.resources is not None
            assert init.resources.subscribe is True
            listed = await session.list_resources()
            assert [str(r.uri) for r in listed.resources] == ["sftq://queue"]
            templates = await session.list_resource_templates()
            assert [t.uriTemplate for t in templates.resourceTemplates] == ["sftq://jobs/{id}"]
            job = ok(await session.call_tool("submit_job", {
                "kind": "SFT", "fireworks_payload": PAYLOAD, "gpu_count": 1}))
            uri = f"sftq://jobs/{job['id']}"
            read = await session.read_resource(uri)  # type: ignore[arg-type]
            content = read.contents[0]
            assert isinstance(content, types.TextResourceContents)
            assert json.loads(content.text)["state"] == "QUEUED"
            queue = await session.read_resource("sftq://queue")  # type: ignore[arg-type]
            assert isinstance(queue.contents[0], types.TextResourceContents)
            assert "your_queued_jobs" in json.loads(queue.contents[0].text)
            await session.subscribe_resource(uri)  # type: ignore[arg-type]
            ok(await session.call_tool("cancel_job", {"job_id": job["id"]}))
            with anyio.fail_after(10):
                while uri not in updated:
                    await anyio.sleep(0.1)
            await session.unsubscribe_resource(uri)  # type: ignore[arg-type]

    anyio.run(main)


def test_missing_settings_stop_it_before_the_protocol() -> None:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "sftq_client", "mcp"], env=clean_env(),
                          input="", capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""  # stdout is the protocol's alone
    assert "SFTQ_API_KEY" in proc.stderr and "SUPABASE_URL" in proc.stderr
