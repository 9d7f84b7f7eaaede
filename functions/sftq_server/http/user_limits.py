"""The per-user limits the MCP endpoint applies itself (issue 52).

jobs-api applies the limits inside its procedures (sql/procedures/195_user_limits.sql): POST
/jobs, POST /jobs:validate and retries count against the caller's request rate, and a stream
holds a lease row. The MCP endpoint runs its tools over jobs-api, so a tool that only reads
(get_job, list_jobs, a wait that polls) would not be counted there. Here, with the same
procedures: every `tools/call` counts one request against the caller's rate, and a
`wait_for_job` holds one of the caller's stream slots (a lease of kind `wait`, renewed while
it waits) for as long as it waits. A refusal is answered as the tool error the agent would get
from jobs-api: `rate_limited` or `too_many_streams`, with the status and details.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from sftq_server import db as dbmod
from sftq_server.core.errors import SftqError

logger = logging.getLogger("sftq.mcp")


class UserLimits:
    """The rate and wait-slot checks of one process, over its database pool."""

    def __init__(self, db: dbmod.Database, *, lease_ttl_seconds: int = 120,
                 renew_seconds: float = 30.0) -> None:
        self.db = db
        self.lease_ttl_seconds = lease_ttl_seconds
        self.renew_seconds = renew_seconds

    async def take_call(self, key: str) -> None:
        """Count one request against the key's user (401, 429 rate_limited)."""
        await asyncio.to_thread(self.db.scalar, dbmod.API_RATE_TAKE, (_hash(key),))

    @contextlib.asynccontextmanager
    async def wait_slot(self, key: str) -> AsyncIterator[None]:
        """Hold one of the key's user's stream slots (429 too_many_streams when none is
        free); renewed while held, freed on the way out (or expired if the process dies)."""
        lease = str(uuid.uuid4())
        await asyncio.to_thread(self.db.scalar, dbmod.API_LEASE_TAKE,
                                (_hash(key), lease, "wait", self.lease_ttl_seconds))
        renewer = asyncio.get_running_loop().create_task(self._renew(lease))
        try:
            yield
        finally:
            renewer.cancel()
            try:
                await asyncio.to_thread(self.db.scalar, dbmod.API_LEASES_RELEASE, ([lease],))
            except Exception as exc:  # noqa: BLE001 - it expires with its TTL
                logger.warning("could not free a wait slot (%s); it expires", exc)

    async def _renew(self, lease: str) -> None:
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                await asyncio.to_thread(self.db.scalar, dbmod.API_LEASES_RENEW,
                                        ([lease], self.lease_ttl_seconds))
            except Exception as exc:  # noqa: BLE001 - tried again at the next turn
                logger.warning("could not renew a wait slot (%s)", exc)


def _hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@contextlib.asynccontextmanager
async def mcp_limits(limits: UserLimits | None, key: str, rpc: str | None,
                     message: Any) -> AsyncIterator[bytes | None]:
    """Around one MCP request: yields None to go on (holding a wait slot for wait_for_job),
    or the JSON-RPC answer of a refusal, a tool error carrying the limit's code. `message` is
    the request as the endpoint parsed it, once (never read again from the raw text)."""
    if limits is None or rpc != "tools/call":
        yield None
        return
    try:
        request_id = message["id"]
        params = message.get("params") or {}
        tool = params.get("name") if isinstance(params, dict) else None
    except (ValueError, TypeError, KeyError, AttributeError):
        yield None  # not a well-formed call: the transport answers it
        return
    try:
        await limits.take_call(key)
    except SftqError as exc:
        yield _tool_error(request_id, exc)
        return
    if tool != "wait_for_job":
        yield None
        return
    slot = limits.wait_slot(key)
    try:
        await slot.__aenter__()
    except SftqError as exc:
        yield _tool_error(request_id, exc)
        return
    try:
        yield None
    finally:
        await slot.__aexit__(None, None, None)


def _tool_error(request_id: Any, exc: SftqError) -> bytes:
    """A tools/call result with isError, as the tools report a jobs-api error (the text is
    sftq_client.mcp's ToolError payload: code, message, status, details)."""
    error: dict[str, Any] = {"code": exc.code, "message": exc.message, "status": exc.status}
    if exc.detail is not None:
        error["details"] = exc.detail
    text = json.dumps({"error": error})
    # Compact, as the mcp package writes its answers.
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {
        "content": [{"type": "text", "text": text}], "isError": True}},
        separators=(",", ":")).encode()
