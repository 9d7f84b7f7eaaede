"""The MCP server: the tools of :mod:`.tools` and two read-only resources, on the ``mcp``
package's low-level server (explicit schemas, our own validation and error results).

``build_server(client_for, subscriptions=...)`` is the one server both transports run:

- stdio (``sftq mcp``, :func:`serve_stdio`): one client from SFTQ_API_KEY / SUPABASE_URL, and
  resource subscriptions: a subscribed resource is re-read every few seconds and a
  ``notifications/resources/updated`` goes out when it changed.
- Streamable HTTP (the stack's ``/functions/v1/mcp``, served by sftq_server.http.mcp): a client
  per request, made from that request's bearer key, so each call acts as the key's user. It is
  stateless (any instance answers any request, as the functions are), so it has no standing
  stream to notify on and does not offer subscriptions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, Final

import anyio
import mcp.types as types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.shared.exceptions import McpError
from pydantic import AnyUrl

from .._client import AsyncClient
from .._version import __version__
from .tools import RULES, TOOLS, ToolError, call_tool, input_schema, output_schema, tool_error_for

__all__ = ["INSTRUCTIONS", "McpServer", "build_server", "serve_stdio"]

logger = logging.getLogger("sftq.mcp")

INSTRUCTIONS: Final = (
    "finetune-queue: the fair FIFO admission queue in front of Fireworks fine-tuning. Submit "
    "SFT, DPO and RFT jobs with submit_job (always with an idempotency_key), follow them with "
    "get_job, wait_for_job, job_events and queue_position, cancel with cancel_job. " + RULES
)

QUEUE_URI: Final = "sftq://queue"
JOB_URI_TEMPLATE: Final = "sftq://jobs/{id}"
_JOB_URI_RE: Final = re.compile(r"sftq://jobs/([^/?#]{1,64})")
# MCP's "resource not found" error code (the specification's -32002).
RESOURCE_NOT_FOUND: Final = -32002

# The client to act with for one request: given the transport's request object (the HTTP
# request, None on stdio), an async context that yields the client and closes what it opened.
ClientFor = Callable[[Any], AbstractAsyncContextManager[AsyncClient]]


class McpServer(Server[Any, Any]):
    """The low-level server, offering `subscribe` when it has a subscribe handler (the
    package's own get_capabilities always says False)."""

    def get_capabilities(self, notification_options: NotificationOptions,
                         experimental_capabilities: dict[str, dict[str, Any]]
                         ) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(notification_options, experimental_capabilities)
        if capabilities.resources is not None and types.SubscribeRequest in self.request_handlers:
            capabilities.resources.subscribe = True
        return capabilities


def _tool_definitions() -> list[types.Tool]:
    return [
        types.Tool(
            name=tool.name,
            title=tool.title,
            description=tool.description,
            inputSchema=input_schema(tool),
            outputSchema=output_schema(tool),
            annotations=types.ToolAnnotations(
                title=tool.title,
                readOnlyHint=tool.read_only,
                destructiveHint=False if tool.read_only else tool.name == "cancel_job",
                idempotentHint=tool.idempotent,
                openWorldHint=False,
            ),
        )
        for tool in TOOLS
    ]


def _error_result(error: ToolError) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=error.text())], isError=True
    )


async def read_resource_text(client: AsyncClient, uri: str) -> str:
    """The JSON text of one resource (the queue, or one of the caller's jobs)."""
    if uri == QUEUE_URI:
        return (await client.queue_context()).model_dump_json()
    match = _JOB_URI_RE.fullmatch(uri)
    if match is None:
        raise McpError(types.ErrorData(
            code=RESOURCE_NOT_FOUND,
            message=f"no resource {uri[:100]!r}: the resources are {QUEUE_URI} and "
                    f"{JOB_URI_TEMPLATE}"))
    try:
        job = await client.get(await client.resolve_job_id(match.group(1)))
    except Exception as exc:
        error = tool_error_for(exc)
        code = RESOURCE_NOT_FOUND if error.code == "not_found" else types.INTERNAL_ERROR
        if error.code == "invalid_arguments":
            code = types.INVALID_PARAMS
        raise McpError(types.ErrorData(code=code, message=error.message,
                                       data=error.payload()["error"])) from None
    return job.model_dump_json()


class _Subscriptions:
    """Subscribed resource URIs and the digest of what each last read; the watcher re-reads
    them and notifies the session of each one that changed."""

    def __init__(self) -> None:
        self.digests: dict[str, str | None] = {}
        self.session: Any = None

    @staticmethod
    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    async def watch(self, client_for: ClientFor, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            if not self.digests or self.session is None:
                continue
            async with client_for(None) as client:
                for uri in list(self.digests):
                    try:
                        current = self.digest(await read_resource_text(client, uri))
                    except Exception:  # a gone job, a failed read: try again next round
                        logger.debug("could not re-read %s", uri, exc_info=True)
                        continue
                    if uri in self.digests and self.digests[uri] != current:
                        self.digests[uri] = current
                        await self.session.send_resource_updated(AnyUrl(uri))


def build_server(client_for: ClientFor, *, subscriptions: bool = False,
                 watch_interval: float = 5.0) -> McpServer:
    """The MCP server over `client_for`; with `subscriptions`, run `server.watch()` beside it
    (serve_stdio does) for resource-updated notifications."""
    server = McpServer("finetune-queue", version=__version__, instructions=INSTRUCTIONS)
    definitions = _tool_definitions()

    def request_object() -> Any:
        return server.request_context.request

    @server.list_tools()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        return definitions

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    async def handle_call(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        ctx = server.request_context
        token = ctx.meta.progressToken if ctx.meta is not None else None

        async def progress(elapsed: float, total: float | None, message: str) -> None:
            if token is None:
                return
            await ctx.session.send_progress_notification(
                token, elapsed, total, message, related_request_id=str(ctx.request_id))

        try:
            async with client_for(ctx.request) as client:
                data = await call_tool(client, name, arguments, progress)
        except ToolError as error:
            return _error_result(error)
        except Exception as exc:  # the client could not be made (settings): still a tool error
            return _error_result(tool_error_for(exc))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(data))],
            structuredContent=data,
        )

    @server.list_resources()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_resources() -> list[types.Resource]:
        return [types.Resource(
            uri=AnyUrl(QUEUE_URI), name="queue", title="Your place in the queue",
            description="your running job, your queued jobs (position, waiting reason, "
                        "estimate) and the global queue depth", mimeType="application/json")]

    @server.list_resource_templates()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_resource_templates() -> list[types.ResourceTemplate]:
        return [types.ResourceTemplate(
            uriTemplate=JOB_URI_TEMPLATE, name="job", title="One of your jobs",
            description="the job as get_job answers it", mimeType="application/json")]

    @server.read_resource()  # type: ignore[no-untyped-call, untyped-decorator]
    async def read_resource(uri: AnyUrl) -> list[ReadResourceContents]:
        async with client_for(request_object()) as client:
            text = await read_resource_text(client, str(uri))
        return [ReadResourceContents(content=text, mime_type="application/json")]

    if subscriptions:
        subs = _Subscriptions()
        server.subscriptions = subs  # type: ignore[attr-defined]

        @server.subscribe_resource()  # type: ignore[no-untyped-call, untyped-decorator]
        async def subscribe(uri: AnyUrl) -> None:
            subs.session = server.request_context.session
            async with client_for(request_object()) as client:
                # Read now, so that a change from here on is noticed (and a bad URI refused).
                subs.digests[str(uri)] = subs.digest(await read_resource_text(client, str(uri)))

        @server.unsubscribe_resource()  # type: ignore[no-untyped-call, untyped-decorator]
        async def unsubscribe(uri: AnyUrl) -> None:
            subs.digests.pop(str(uri), None)

        async def watch() -> None:
            await subs.watch(client_for, watch_interval)

        server.watch = watch  # type: ignore[attr-defined]
    return server


async def serve_stdio(client: AsyncClient, *, watch_interval: float = 5.0) -> None:
    """Serve the tools on stdin/stdout with one client (``sftq mcp``) until stdin closes."""
    from mcp.server.stdio import stdio_server

    server = build_server(lambda request: nullcontext(client), subscriptions=True,
                          watch_interval=watch_interval)
    options = server.create_initialization_options(NotificationOptions())
    async with stdio_server() as (read, write), anyio.create_task_group() as group:
        group.start_soon(server.watch)  # type: ignore[attr-defined]
        await server.run(read, write, options)
        group.cancel_scope.cancel()
