"""``sftq mcp``: the MCP server on stdin/stdout, for an agent's MCP client to start.

It acts with the same settings as every other command (``--api-key`` / SFTQ_API_KEY,
``--api-url`` / SFTQ_API_URL / SUPABASE_URL); stdout carries only the protocol, diagnostics go
to stderr. Needs the ``mcp`` extra: ``pip install 'finetune-queue[mcp]'``.
"""

from __future__ import annotations

import argparse

from .._client import AsyncClient
from ._common import EXIT_OK, EXIT_USAGE, CommandFactory, Context, err, positive_float

MCP_HINT = "error: `sftq mcp` needs the mcp extra: pip install 'finetune-queue[mcp]'"


def _cmd_mcp(args: argparse.Namespace, ctx: Context) -> int:
    try:
        import anyio

        from ..mcp import serve_stdio
    except ImportError as exc:
        err(MCP_HINT)
        err(f"({exc})")
        return EXIT_USAGE
    # Made before the protocol starts, so missing settings are reported (exit 2) at once.
    client = AsyncClient(api_key=args.api_key, base_url=args.api_url)

    async def run() -> None:
        async with client:
            await serve_stdio(client, watch_interval=args.watch_interval)

    anyio.run(run)
    return EXIT_OK


def register(command: CommandFactory) -> None:
    p = command("mcp", "serve the MCP tools for agents on stdin/stdout (docs/agents.md)")
    p.add_argument("--watch-interval", type=positive_float, default=5.0, metavar="S",
                   help="seconds between re-reads of subscribed resources (default 5)")
    p.set_defaults(handler=_cmd_mcp)
