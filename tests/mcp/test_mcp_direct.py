"""The HTTP endpoint's direct answer (sftq_server.http.mcp.DirectDispatch) answers every request
it takes exactly as the mcp package's transport answers it, and leaves every other request to
the transport.

Each request goes to two endpoints over the same canned jobs-api: one that answers directly
where it can, one that sends everything to the transport. Status, content type and JSON-RPC
answer must be the same, and the direct one must have taken exactly the requests listed as its
own (so a change in the package that sends them all to the transport shows here, instead of as
a slower bench row)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import anyio
import httpx
import pytest

from sftq_server.http import mcp as http_mcp

JOB_ID = str(uuid.UUID(int=7))
JOB = {"id": JOB_ID, "kind": "SFT", "state": "QUEUED", "display_name": None, "gpu_count": 4,
       "fireworks_payload": {"baseModel": "accounts/fireworks/models/qwen3-14b",
                             "dataset": "accounts/demo/datasets/direct"},
       "fireworks_job_name": None, "error": None, "failure_class": None,
       "created_at": "2026-12-07T00:00:00Z", "submitted_at": None, "finished_at": None,
       "cancel_requested": False, "warnings": [], "estimated_cost": None}
KEY = "sftq_" + "d" * 40
JSON_AND_SSE = "application/json, text/event-stream"


def jobs_api(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/health"):  # the client asks it after a 404
        return httpx.Response(200, json={"status": "ok"})
    if request.method == "GET" and request.url.path.endswith(f"/jobs/{JOB_ID}"):
        return httpx.Response(200, json=JOB)
    if request.method == "GET" and request.url.path.endswith("/jobs"):
        return httpx.Response(200, json=[JOB])
    return httpx.Response(404, json={"error": "no such job", "code": "not_found"})


def call(name: str, arguments: Any, id_: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}}


def rpc(method: str, params: Any = None, id_: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        message["params"] = params
    return message


INITIALIZE = rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "test", "version": "0"}})

# (what it is, body, extra headers, answered directly? None: answered before either way)
CASES: list[tuple[str, Any, dict[str, str], bool | None]] = [
    ("tools/list", rpc("tools/list"), {}, True),
    ("get_job", call("get_job", {"job_id": JOB_ID}), {}, True),
    ("get_job, string id", call("get_job", {"job_id": JOB_ID}, id_="a-1"), {}, True),
    ("another user's job", call("get_job", {"job_id": str(uuid.UUID(int=8))}), {}, True),
    ("wrong type", call("get_job", {"job_id": 5}), {}, True),
    ("no arguments", call("get_job", None), {}, True),
    ("unknown tool", call("no_such_tool", {}), {}, True),
    ("list_jobs", call("list_jobs", {"limit": 1}), {}, True),
    ("ping", rpc("ping"), {}, True),
    ("resources/list", rpc("resources/list"), {}, True),
    ("resource templates", rpc("resources/templates/list"), {}, True),
    ("bad resource", rpc("resources/read", {"uri": "sftq://nothing"}), {}, True),
    ("no protocol header", rpc("tools/list"), {"mcp-protocol-version": ""}, True),
    ("JSON only", rpc("tools/list"), {"accept": "application/json"}, True),
    ("initialize", INITIALIZE, {}, False),
    ("notification", {"jsonrpc": "2.0", "method": "notifications/initialized"}, {}, False),
    ("unknown method", rpc("no/such/method"), {}, False),
    ("no handler", rpc("prompts/list"), {}, False),
    ("tools/call without name", rpc("tools/call", {"arguments": {}}), {}, False),
    ("not JSON", b"{not json", {}, None),
    ("nested 2,000 deep", json.dumps(call("get_job", {"job_id": JOB_ID, "x": 0})).replace(
        "0}", '{"a": ' * 2000 + "1" + "}" * 2000 + "}").encode(), {}, None),
    ("not JSON-RPC", {"hello": "world"}, {}, False),
    ("not acceptable", rpc("tools/list"), {"accept": "text/html"}, False),
    ("wrong content type", rpc("tools/list"), {"content-type": "text/plain"}, False),
    ("unknown protocol version", rpc("tools/list"), {"mcp-protocol-version": "1999-01-01"},
     False),
]


async def post(app: http_mcp.McpHttpApp, body: Any, extra: dict[str, str]
               ) -> tuple[int, str, Any]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"host": "127.0.0.1:8080",
               "authorization": f"Bearer {KEY}", "content-type": "application/json",
               "accept": JSON_AND_SSE, "mcp-protocol-version": "2025-06-18"} | extra
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/", "raw_path": b"/",
             "root_path": "", "query_string": b"", "server": ("127.0.0.1", 80),
             "client": ("127.0.0.1", 1),
             "headers": [(k.encode(), v.encode()) for k, v in headers.items() if v]}
    received = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": content, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    assert start["type"] == "http.response.start"
    headers_out = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    raw = b"".join(m.get("body", b"") for m in sent[1:])
    try:
        answer = json.loads(raw) if raw else None
    except ValueError:  # the transport's plain-text refusals
        answer = raw.decode()
    return start["status"], headers_out.get("content-type", ""), answer


def test_both_ways_answer_alike_and_the_direct_one_takes_only_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[bool] = []
    answer = http_mcp.DirectDispatch.answer

    async def spied(self: http_mcp.DirectDispatch, scope: Any, body: bytes, send: Any) -> bool:
        result = await answer(self, scope, body, send)
        taken.append(result)
        return result

    monkeypatch.setattr(http_mcp.DirectDispatch, "answer", spied)

    async def main() -> None:
        direct = http_mcp.McpHttpApp("http://jobs.test/v1",
                                     transport=httpx.MockTransport(jobs_api))
        through = http_mcp.McpHttpApp("http://jobs.test/v1", direct=False,
                                      transport=httpx.MockTransport(jobs_api))
        try:
            for what, body, extra, expect_direct in CASES:
                taken.clear()
                fast = await post(direct, body, extra)
                assert taken == ([] if expect_direct is None else [expect_direct]), what
                taken.clear()
                slow = await post(through, body, extra)
                assert taken == [], what
                assert fast == slow, what
        finally:
            await direct.aclose()
            await through.aclose()

    anyio.run(main)


def test_the_direct_answers_are_the_tools_answers() -> None:
    """Not merely alike: the direct answer carries the tool's result and the tool's error."""

    async def main() -> None:
        app = http_mcp.McpHttpApp("http://jobs.test/v1", transport=httpx.MockTransport(jobs_api))
        try:
            status, ctype, found = await post(app, call("get_job", {"job_id": JOB_ID}), {})
            assert (status, ctype) == (200, "application/json")
            assert found["id"] == 1 and found["result"]["isError"] is False
            assert found["result"]["structuredContent"]["id"] == JOB_ID
            _, _, missing = await post(app, call("get_job", {"job_id": str(uuid.UUID(int=8))}),
                                       {})
            assert missing["result"]["isError"] is True
            error = json.loads(missing["result"]["content"][0]["text"])["error"]
            assert error["code"] == "not_found"
            _, _, bad = await post(app, rpc("resources/read", {"uri": "sftq://nothing"}), {})
            assert bad["error"]["code"] == -32002 and "sftq://queue" in bad["error"]["message"]
        finally:
            await app.aclose()

    anyio.run(main)


def test_the_key_check_takes_an_odd_answer_and_refuses_when_jobs_api_is_down() -> None:
    """jobs-api answering 200 oddly has taken the key: the initialize is answered. jobs-api not
    answering at all decides nothing: 503, never an answer for an unchecked key."""

    def odd(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"not": "a list"})

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async def main() -> None:
        app = http_mcp.McpHttpApp("http://jobs.test/v1", transport=httpx.MockTransport(odd))
        unreachable = http_mcp.McpHttpApp("http://jobs.test/v1",
                                          transport=httpx.MockTransport(down))
        try:
            status, _, answer = await post(app, INITIALIZE, {})
            assert status == 200 and answer["result"]["serverInfo"]["name"] == "finetune-queue"
            for body in (INITIALIZE, rpc("tools/list"), rpc("ping")):
                status, _, answer = await post(unreachable, body, {})
                assert status == 503 and answer["code"] == "unavailable", answer
        finally:
            await app.aclose()
            await unreachable.aclose()

    anyio.run(main)
