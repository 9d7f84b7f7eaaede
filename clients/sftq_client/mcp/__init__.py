"""An MCP (Model Context Protocol) server for agents: the queue's tools and resources.

Needs the ``mcp`` extra (``pip install 'finetune-queue[mcp]'``): nothing else in sftq_client
imports this package, so a client-only install does not need the ``mcp`` package.

- stdio: ``sftq mcp`` (SFTQ_API_KEY, and SUPABASE_URL or SFTQ_API_URL, as every command);
- Streamable HTTP: ``$SUPABASE_URL/functions/v1/mcp`` on the stack (docs/agents.md).
"""

from __future__ import annotations

from .server import INSTRUCTIONS, build_server, serve_stdio
from .tools import RULES, TOOLS, ToolError, call_tool

__all__ = ["INSTRUCTIONS", "RULES", "TOOLS", "ToolError", "build_server", "call_tool",
           "serve_stdio"]
