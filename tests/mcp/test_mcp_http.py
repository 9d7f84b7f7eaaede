"""The MCP tools over Streamable HTTP at $SUPABASE_URL/functions/v1/mcp on a live `sftq dev`,
driven by the mcp package's own client (ClientSession + streamable_http_client): each request
acts as its bearer key's user, two users are isolated, errors are tool errors, and a killed
connection loses no job (the idempotency key makes the resubmission the same job)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

PAYLOAD = {"baseModel": "accounts/fireworks/models/qwen3-14b",
           "dataset": "accounts/demo/datasets/mcp-http"}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def mcp_url(stack: Any) -> str:
    return f"{stack.base}/functions/v1/mcp"


@asynccontextmanager
async def http_session(stack: Any, key: str | None = None) -> AsyncIterator[ClientSession]:
    client = httpx.AsyncClient(headers={"Authorization": f"Bearer {key or stack.key}"},
                               timeout=httpx.Timeout(30, read=300))
    async with client, streamable_http_client(mcp_url(stack), http_client=client) as (
            read, write, _), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def ok(result: types.CallToolResult) -> dict[str, Any]:
    assert not result.isError, result.content
    assert result.structuredContent is not None
    return result.structuredContent


def error_of(result: types.CallToolResult) -> dict[str, Any]:
    assert result.isError, result
    assert isinstance(result.content[0], types.TextContent)
    error: dict[str, Any] = json.loads(result.content[0].text)["error"]
    return error


def rpc(method: str, params: dict[str, Any], id_: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


def test_tools_submit_wait_with_progress_cancel_events(stack: Any) -> None:
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def main() -> None:
        async with http_session(stack) as session:
            caps = session.get_server_capabilities()
            assert caps is not None and caps.tools is not None
            # Stateless HTTP has no standing stream to notify on: no subscriptions offered.
            assert caps.resources is not None and not caps.resources.subscribe
            tools = (await session.list_tools()).tools
            assert len(tools) == 9 and all(t.outputSchema for t in tools)
            job = ok(await session.call_tool("submit_job", {
                "kind": "RFT", "fireworks_payload": PAYLOAD, "display_name": "mcp http",
                "gpu_count": 2, "idempotency_key": str(uuid.uuid4())}))
            assert job["state"] == "QUEUED" and job["kind"] == "RFT"
            waited = ok(await session.call_tool(
                "wait_for_job", {"job_id": job["id"], "timeout_seconds": 1.2,
                                 "poll_interval_seconds": 0.2}, progress_callback=on_progress))
            assert waited["timed_out"] is True and waited["job"]["state"] == "QUEUED"
            # The notifications came on the request's own SSE answer, before the result.
            assert len(progress) >= 2 and "QUEUED" in (progress[0][2] or "")
            cancelled = ok(await session.call_tool("cancel_job", {"job_id": job["id"]}))
            assert cancelled["state"] == "CANCELLED"
            events = ok(await session.call_tool("job_events", {"job_id": job["id"]}))
            assert [e["type"] for e in events["events"]] == ["queued", "cancelled"]
            got = ok(await session.call_tool("get_job", {"job_id": job["id"]}))
            assert got["state"] == "CANCELLED"
            read = await session.read_resource(f"sftq://jobs/{job['id']}")  # type: ignore[arg-type]
            assert isinstance(read.contents[0], types.TextResourceContents)
            assert json.loads(read.contents[0].text)["state"] == "CANCELLED"

    anyio.run(main)


def test_two_users_are_isolated(stack: Any) -> None:
    other = stack.user(f"mcp-other-{uuid.uuid4().hex[:8]}")

    async def main() -> None:
        async with http_session(stack) as mine, http_session(stack, other) as theirs:
            job = ok(await mine.call_tool("submit_job", {
                "kind": "SFT", "fireworks_payload": PAYLOAD, "display_name": "mine"}))
            for name in ("get_job", "cancel_job", "job_events", "wait_for_job", "retry_job",
                         "queue_position"):
                error = error_of(await theirs.call_tool(name, {"job_id": job["id"]}))
                assert error["code"] == "not_found", (name, error)
            listed = ok(await theirs.call_tool("list_jobs", {"limit": 100}))
            assert job["id"] not in {j["id"] for j in listed["jobs"]}
            # The prefix form does not find it either.
            error = error_of(await theirs.call_tool("get_job", {"job_id": job["id"][:8]}))
            assert error["code"] == "not_found"
            try:
                await theirs.read_resource(f"sftq://jobs/{job['id']}")  # type: ignore[arg-type]
            except Exception as exc:
                assert "not" in str(exc).lower()
            else:
                raise AssertionError("another user's job resource was readable")
            # Still theirs to see, and still QUEUED: the other user's calls changed nothing.
            assert ok(await mine.call_tool("get_job", {"job_id": job["id"]}))["state"] == "QUEUED"
            ok(await mine.call_tool("cancel_job", {"job_id": job["id"]}))

    anyio.run(main)


def test_requests_without_an_accepted_key_are_refused(stack: Any) -> None:
    init = rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                              "clientInfo": {"name": "t", "version": "0"}})
    made_up = {"Authorization": f"Bearer sftq_{uuid.uuid4().hex}"}
    with httpx.Client(timeout=30) as http:
        for headers in ({}, {"Authorization": "Bearer nope"}, made_up):
            r = http.post(mcp_url(stack), json=init, headers=ACCEPT | headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["code"] == "unauthorized"
            assert r.headers["www-authenticate"].startswith("Bearer")
        # Every request is checked, whatever it carries and however it spells it: the key
        # decides, never the method read from the raw text.
        crafted = [
            b'{"jsonrpc": "2.0", "id": 1, "_meta": {"method": "ping"}, "method": "initialize",'
            b' "params": {"protocolVersion": "2025-06-18", "capabilities": {},'
            b' "clientInfo": {"name": "t", "version": "0"}}}',
            json.dumps(init).replace('"initialize"', '"\\u0069nitialize"').encode(),
            json.dumps(rpc("tools/list", {})).encode(),
            json.dumps(rpc("ping", {})).encode(),
            json.dumps(rpc("resources/list", {})).encode(),
            json.dumps(rpc("tools/call", {"name": "list_jobs", "arguments": {}})).encode(),
            json.dumps(rpc("tools/call", {"name": "no_such_tool", "arguments": {}})).encode(),
        ]
        for body in crafted:
            r = http.post(mcp_url(stack), content=body, headers=ACCEPT | made_up)
            assert r.status_code == 401, (body, r.text)
            assert r.json()["code"] == "unauthorized" and "result" not in r.text
        # The same crafted initialize with an accepted key is answered as an initialize.
        r = http.post(mcp_url(stack), content=crafted[0], headers=ACCEPT | stack.auth())
        assert r.status_code == 200 and r.json()["result"]["serverInfo"]["name"], r.text


def test_get_is_refused_at_once_and_never_held_open(stack: Any) -> None:
    sse = {"Accept": "text/event-stream"}
    with httpx.Client(timeout=httpx.Timeout(5)) as http:
        # A made-up key: 401 straight away (the stateless endpoint pushes nothing on GET; a
        # stream held open for it would cost a server thread each).
        for _ in range(30):
            r = http.get(mcp_url(stack), headers=sse | {"Authorization": "Bearer sftq_fake1"})
            assert r.status_code == 401 and r.json()["code"] == "unauthorized"
        r = http.get(mcp_url(stack), headers=sse)
        assert r.status_code == 401
        # An accepted key: 405, Allow: POST (what the specification says a server without a
        # GET stream answers; the clients of both majors take it).
        for method in ("GET", "DELETE"):
            r = http.request(method, mcp_url(stack), headers=sse | stack.auth())
            assert r.status_code == 405 and r.headers["allow"] == "POST", (method, r.text)
            assert r.json()["code"] == "method_not_allowed"


def test_bodies_the_server_cannot_take_are_clear_errors(stack: Any) -> None:
    with httpx.Client(timeout=30) as http:
        # Nested 2,000 deep: JSON-RPC's parse error, not a 500 (RecursionError).
        deep = json.dumps(rpc("tools/call", {"name": "get_job", "arguments": {"x": 0}})).replace(
            '"x": 0', '"x": ' + '{"a": ' * 2000 + "1" + "}" * 2000).encode()
        r = http.post(mcp_url(stack), content=deep, headers=ACCEPT | stack.auth())
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == -32700
        r = http.post(mcp_url(stack), content=b"{not json", headers=ACCEPT | stack.auth())
        assert r.status_code == 400 and r.json()["error"]["code"] == -32700
        # Far over any payload the queue takes (8x jobs-api's limit): refused unread.
        r = http.post(mcp_url(stack), content=b"x" * 9_000_000, headers=ACCEPT | stack.auth())
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
        r = http.post(mcp_url(stack) + "/x", json=rpc("tools/list", {}),
                      headers=ACCEPT | stack.auth())
        assert r.status_code == 404
        # And the server answers the next request as usual.
        r = http.post(mcp_url(stack), json=rpc("tools/list", {}), headers=ACCEPT | stack.auth())
        assert r.status_code == 200 and len(r.json()["result"]["tools"]) == 9


def test_an_over_large_payload_is_the_tool_error_payload_too_large(stack: Any) -> None:
    # 2 MB of fireworks_payload (jobs-api takes 1 MiB): the official client sees the tool
    # error docs/agents.md promises, as over stdio, and the session goes on.
    big = {"kind": "SFT", "fireworks_payload": PAYLOAD | {"blob": "x" * 2_000_000}}

    async def main() -> None:
        async with http_session(stack) as session:
            for _ in range(2):
                error = error_of(await session.call_tool("submit_job", big))
                assert error["code"] == "payload_too_large" and error["status"] == 413, error
            listed = ok(await session.call_tool("list_jobs", {"limit": 1}))
            assert "jobs" in listed

    anyio.run(main)


def test_host_and_origin_are_checked(stack: Any) -> None:
    listing = rpc("tools/list", {})
    port = httpx.URL(stack.base).port
    with httpx.Client(timeout=30) as http:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            r = http.post(mcp_url(stack), json=listing,
                          headers=ACCEPT | stack.auth() | {"Host": host})
            assert r.status_code == 200, (host, r.text)
        # DNS rebinding: a page of another site reaching the local server by a name of its
        # own, or posting from its own origin.
        r = http.post(mcp_url(stack), json=listing,
                      headers=ACCEPT | stack.auth() | {"Host": "evil.example"})
        assert r.status_code == 421 and r.json()["code"] == "host_not_allowed", r.text
        assert "SFTQ_MCP_ALLOWED_HOSTS" in r.json()["error"]
        r = http.post(mcp_url(stack), json=listing,
                      headers=ACCEPT | stack.auth() | {"Origin": "http://evil.example"})
        assert r.status_code == 403 and r.json()["code"] == "origin_not_allowed", r.text
        r = http.post(mcp_url(stack), json=listing,
                      headers=ACCEPT | stack.auth() | {"Origin": f"http://localhost:{port}"})
        assert r.status_code == 200, r.text


def test_the_allowed_hosts_are_a_setting() -> None:
    from sftq_server.http.mcp import transport_security

    default = transport_security("", "https://abc.supabase.co")
    assert default.enable_dns_rebinding_protection
    assert {"127.0.0.1:*", "localhost:*", "abc.supabase.co"} <= set(default.allowed_hosts)
    assert "https://abc.supabase.co" in default.allowed_origins
    chosen = transport_security("mcp.example.com, mcp.example.com:8443")
    assert chosen.allowed_hosts == ["mcp.example.com", "mcp.example.com:8443"]
    assert "127.0.0.1:*" not in chosen.allowed_hosts
    assert not transport_security("*").enable_dns_rebinding_protection


def test_a_killed_connection_loses_no_job(stack: Any) -> None:
    key = str(uuid.uuid4())
    name = f"mcp-killed-{key[:8]}"
    arguments = {"kind": "SFT", "fireworks_payload": PAYLOAD, "display_name": name,
                 "idempotency_key": key}
    call = rpc("tools/call", {"name": "submit_job", "arguments": arguments})
    # The connection dies once the server has started its answer: the agent never sees it.
    with httpx.Client(timeout=30) as http, http.stream(
            "POST", mcp_url(stack), json=call, headers=ACCEPT | stack.auth()) as r:
        assert r.status_code == 200
    # A wait killed mid-stream leaves the job as it was.

    async def main() -> None:
        async with http_session(stack) as session:
            again = ok(await session.call_tool("submit_job", arguments))
            twice = ok(await session.call_tool("submit_job", arguments))
            assert again["id"] == twice["id"]
            listed = ok(await session.call_tool("list_jobs", {"limit": 100}))
            mine = [j for j in listed["jobs"] if j["display_name"] == name]
            assert [j["id"] for j in mine] == [again["id"]]
            job_id = again["id"]
        wait = rpc("tools/call", {"name": "wait_for_job", "_meta": {"progressToken": 7},
                                  "arguments": {"job_id": job_id, "timeout_seconds": 30,
                                                "poll_interval_seconds": 0.2}})
        async with httpx.AsyncClient(timeout=30) as http, http.stream(
                "POST", mcp_url(stack), json=wait, headers=ACCEPT | stack.auth()) as r:
            async for line in r.aiter_lines():
                if "notifications/progress" in line:
                    break  # and drop the connection in the middle of the wait
        async with http_session(stack) as session:
            got = ok(await session.call_tool("get_job", {"job_id": job_id}))
            assert got["state"] == "QUEUED"
            ok(await session.call_tool("cancel_job", {"job_id": job_id}))

    anyio.run(main)


def test_the_deployed_entry_point_serves_the_same_tools(stack: Any,
                                                         monkeypatch: Any) -> None:
    # functions/mcp_api.py, as its own ASGI service, calling jobs-api over HTTP with each
    # request's key (here the stack's jobs-api; the transport is the ASGI app in-process).
    import importlib.util

    from mcp_support import ROOT

    monkeypatch.setenv("SFTQ_MCP_JOBS_API_URL", stack.api)
    spec = importlib.util.spec_from_file_location("sftq_mcp_api_entry",
                                                  ROOT / "functions" / "mcp_api.py")
    assert spec is not None and spec.loader is not None
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    app = entry.asgi_app()
    other = stack.user(f"mcp-entry-{uuid.uuid4().hex[:8]}")

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                submit = rpc("tools/call", {"name": "submit_job", "arguments": {
                    "kind": "SFT", "fireworks_payload": PAYLOAD, "display_name": "entry"}})
                r = await http.post("/", json=submit, headers=ACCEPT | stack.auth())
                assert r.status_code == 200, r.text
                # A call without a progress token is answered as one JSON body.
                assert r.headers["content-type"].startswith("application/json")
                data = r.json()
                job = data["result"]["structuredContent"]
                assert job["state"] == "QUEUED"
                get = rpc("tools/call", {"name": "get_job", "arguments": {"job_id": job["id"]}})
                r = await http.post("/", json=get,
                                    headers=ACCEPT | {"Authorization": f"Bearer {other}"})
                assert '\\"code\\": \\"not_found\\"' in r.text
                r = await http.post("/", json=get, headers=ACCEPT)
                assert r.status_code == 401
        finally:
            await app.aclose()
        stack.http.delete(f"{stack.api}/jobs/{job['id']}", headers=stack.auth())

    anyio.run(main)


def test_the_images_server_serves_it_on_its_event_loop(stack: Any, tmp_path: Any) -> None:
    # The Dockerfile's command (granian RSGI, sftq_server.http.gateway_rsgi) on the stack's
    # database: the MCP endpoint runs on granian's loop (http.mcp.RsgiMcp), progress streamed.
    import shutil
    import subprocess
    import sys
    import time
    from pathlib import Path

    from mcp_support import ROOT, clean_env

    from sftq_server.dev.pgcluster import free_port

    granian = Path(sys.executable).parent / "granian"
    assert granian.exists() or shutil.which("granian"), "granian is a dev dependency"
    port = free_port()
    env = clean_env(DATABASE_URL=stack.database_url,
                    SFTQ_TICK_SECRET="mcp-test-tick-secret-0123456789abcdef")
    log = (tmp_path / "granian.log").open("wb")
    proc = subprocess.Popen(
        [str(granian), "--interface", "rsgi", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--no-ws", "--factory", "sftq_server.http.gateway_rsgi:create_app"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/functions/v1/jobs-api/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, \
                (tmp_path / "granian.log").read_text()
            time.sleep(0.2)

        class Image:
            key = stack.key

        image = Image()
        image.base = base  # type: ignore[attr-defined]
        other = stack.user(f"mcp-image-{uuid.uuid4().hex[:8]}")
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        async def main() -> None:
            async with http_session(image) as mine, http_session(image, other) as theirs:
                job = ok(await mine.call_tool("submit_job", {
                    "kind": "SFT", "fireworks_payload": PAYLOAD, "idempotency_key": "img-1"}))
                waited = ok(await mine.call_tool(
                    "wait_for_job", {"job_id": job["id"], "timeout_seconds": 1.0,
                                     "poll_interval_seconds": 0.2},
                    progress_callback=on_progress))
                assert waited["timed_out"] and len(progress) >= 2
                error = error_of(await theirs.call_tool("get_job", {"job_id": job["id"]}))
                assert error["code"] == "not_found"
                ok(await mine.call_tool("cancel_job", {"job_id": job["id"]}))

        anyio.run(main)
        with httpx.Client(timeout=30) as http:
            r = http.post(f"{base}/functions/v1/mcp", content=b"x" * 9_000_000,
                          headers=ACCEPT | stack.auth())
            assert r.status_code == 413
            r = http.get(f"{base}/functions/v1/mcp", headers={
                "Accept": "text/event-stream", "Authorization": "Bearer sftq_fake1"})
            assert r.status_code == 401
            r = http.post(f"{base}/functions/v1/mcp", json=rpc("tools/list", {}), headers=ACCEPT)
            assert r.status_code == 401
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_functions_framework_serves_the_entry_point(monkeypatch: Any) -> None:
    # `functions-framework --source functions/mcp_api.py --target mcp_api --asgi`: the app
    # functions-framework builds from the entry point answers MCP and refuses keyless calls.
    import sys

    import functions_framework.aio as ff_aio
    from mcp_support import ROOT

    monkeypatch.setenv("SFTQ_MCP_JOBS_API_URL", "http://127.0.0.1:9/functions/v1/jobs-api")
    app = ff_aio.create_asgi_app(target="mcp_api", source=str(ROOT / "functions" / "mcp_api.py"))
    listing = rpc("tools/list", {})

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            # jobs-api cannot be reached, so no key can be checked: nothing is answered for
            # one (a made-up key once had tools/list answered).
            r = await http.post("/", json=listing,
                                headers=ACCEPT | {"Authorization": "Bearer sftq_abc"})
            assert r.status_code == 503 and r.json()["code"] == "unavailable", r.text
            assert "result" not in r.text
            r = await http.post("/", json=listing, headers=ACCEPT)
            assert r.status_code == 401
        for name, module in list(sys.modules.items()):
            if name.endswith("mcp_api") and hasattr(module, "_app"):
                await module._app.get().aclose()

    anyio.run(main)


def test_what_the_tools_and_the_skill_say_is_what_they_do(stack: Any) -> None:
    """cancel_job's description and SKILL.md say a PROGRESS job is cancelled at once with
    pending=false; submit_job takes a kind in any case, as HTTP and the CLI; an SFT body sent as
    DPO comes back with a warning for each field the DPO schema lacks (references/dpo.md)."""
    from mcp_support import ROOT

    skill = " ".join((ROOT / "skills" / "finetune-queue" / "SKILL.md").read_text().split())
    dpo = " ".join((ROOT / "skills" / "finetune-queue" / "references" / "dpo.md")
                   .read_text().split())
    user = stack.user(f"mcp-claims-{uuid.uuid4().hex[:8]}")
    sft_body = json.loads((ROOT / "examples" / "sft.json").read_text())

    async def main() -> None:
        async with http_session(stack, user) as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            cancel = " ".join((tools["cancel_job"].description or "").split())
            assert "QUEUED or PROGRESS: cancelled at once" in cancel and "pending=false" in cancel
            assert "cancelled at once" in (tools["cancel_job"].description or "")
            assert "is immediate on QUEUED and on PROGRESS" in skill
            assert "`state: CANCELLED`, `pending: false`" in skill

            # Any case, as POST /jobs and `sftq submit --kind sft`.
            job = ok(await session.call_tool("submit_job", {
                "kind": "sft", "fireworks_payload": PAYLOAD, "display_name": "claims",
                "gpu_count": 1, "idempotency_key": str(uuid.uuid4())}))
            assert job["kind"] == "SFT" and job["state"] == "QUEUED"
            listed = ok(await session.call_tool("list_jobs", {"kind": "sft", "state": "queued"}))
            assert job["id"] in {j["id"] for j in listed["jobs"]}
            for _ in range(5):
                stack.tick()
                if stack.job(job["id"], user)["state"] == "PROGRESS":
                    break
            assert stack.job(job["id"], user)["state"] == "PROGRESS"
            cancelled = ok(await session.call_tool("cancel_job", {"job_id": job["id"]}))
            assert cancelled["state"] == "CANCELLED" and cancelled["pending"] is False, cancelled

    anyio.run(main)
    # An SFT body as DPO: valid to the queue's shape check, with one warning per flat training
    # field (the suite runs with the pre-flight off on POST /jobs; :validate always checks).
    r = stack.http.post(f"{stack.api}/jobs:validate", headers=stack.auth(user),
                        json={"kind": "DPO", "fireworks_payload": sft_body})
    assert r.status_code == 200 and r.json()["valid"] is True, r.text
    warned = {w["path"] for w in r.json()["warnings"]}
    assert {"fireworks_payload.baseModel", "fireworks_payload.learningRate"} <= warned
    assert "one warning per field that is not in the DPO schema" in dpo


def test_submit_job_after_waits_for_the_dependency(stack: Any) -> None:
    # Issue 53: a DPO job after an SFT job, through the MCP tool; another user's id is refused
    # exactly as an unknown one.
    other = stack.user(f"mcp-after-{uuid.uuid4().hex[:8]}")

    async def main() -> None:
        async with http_session(stack) as mine, http_session(stack, other) as theirs:
            sft = ok(await mine.call_tool("submit_job", {
                "kind": "SFT", "fireworks_payload": PAYLOAD, "display_name": "first"}))
            dpo = ok(await mine.call_tool("submit_job", {
                "kind": "DPO", "fireworks_payload": {"dataset": "accounts/demo/datasets/d"},
                "after": [sft["id"][:8]]}))
            assert dpo["after"] == [sft["id"]]
            where = ok(await mine.call_tool("queue_position", {"job_id": dpo["id"]}))
            assert where["job"]["waiting_reason"]["code"] == "waiting_for_dependency"
            assert sft["id"] in where["job"]["waiting_reason"]["message"]
            error = error_of(await theirs.call_tool("submit_job", {
                "kind": "DPO", "fireworks_payload": PAYLOAD, "after": [sft["id"]]}))
            assert error["code"] == "unknown_dependency"
            for job in (dpo, sft):
                await mine.call_tool("cancel_job", {"job_id": job["id"]})

    anyio.run(main)
