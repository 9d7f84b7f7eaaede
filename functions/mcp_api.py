"""functions-framework entry point of the MCP endpoint (Streamable HTTP), on its async stack:

    functions-framework --source functions/mcp_api.py --target mcp_api --asgi

Deployed as its own service, like jobs-stream: a wait_for_job call holds its answer open for
as long as the agent asked (15 minutes at most). Each request acts as its own bearer key's user
by calling jobs-api with that key, at SFTQ_MCP_JOBS_API_URL (default
$SUPABASE_URL/functions/v1/jobs-api). It holds no session state, so any number of instances
may answer; with DATABASE_URL it also applies the per-user limits to tool calls and waits
(one short query each, no connection held while a wait waits). Under `sftq dev` the gateway
serves the same app at /functions/v1/mcp (sftq_server.http.mcp).

Any ASGI server can serve it as well: `uvicorn mcp_api:asgi_app --factory` (PYTHONPATH=functions).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from sftq_server.core.lazy import Lazy

if TYPE_CHECKING:
    from sftq_server.http.mcp import McpHttpApp


def jobs_api_url() -> str:
    url = os.environ.get("SFTQ_MCP_JOBS_API_URL", "").strip()
    if url:
        return url
    base = os.environ.get("SUPABASE_URL", "").strip().rstrip("/")
    if not base:
        raise RuntimeError("set SFTQ_MCP_JOBS_API_URL (or SUPABASE_URL): the MCP endpoint "
                           "calls jobs-api with each request's key")
    return f"{base}/functions/v1/jobs-api"


def _build() -> McpHttpApp:
    from sftq_server.core import logs
    from sftq_server.core.settings import Settings
    from sftq_server.http.mcp import McpHttpApp

    logs.configure()
    settings = Settings.from_env()
    limits = None
    if settings.database_url:
        # With the database, tool calls count against their user's request rate and a
        # wait holds one of the user's stream slots (http/user_limits.py); without it,
        # jobs-api's own limits are all (docs/operations.md, Per-user limits).
        from sftq_server.db import get_database
        from sftq_server.http.user_limits import UserLimits

        limits = UserLimits(get_database(settings.database_url, max_size=settings.db_pool_max,
                                         timeout=settings.db_timeout_seconds))
    return McpHttpApp(jobs_api_url(), max_body_bytes=settings.max_body_bytes,
                      allowed_hosts=settings.mcp_allowed_hosts,
                      public_url=os.environ.get("SUPABASE_URL", ""), limits=limits)


_app = Lazy(_build)


async def mcp_api(request: Any) -> Any:
    """Serve one starlette request (functions-framework --asgi hands us starlette.Request)."""
    return _app.get()


def asgi_app() -> Any:
    """The ASGI application, for any ASGI server: `uvicorn --factory mcp_api:asgi_app`."""
    return _app.get()
