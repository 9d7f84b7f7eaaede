"""Fixtures for the MCP server's tests: a live `sftq dev` (tests/e2e's DevStacks on a clone of
the session's migrated template, as the dashboard's tests start it) that the mcp package's own
client drives, over stdio (`sftq mcp` as a subprocess) and over Streamable HTTP."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import httpx
import pytest
from mcp_support import stack_support
from pytest_postgresql.janitor import DatabaseJanitor

from sftq_server.dev.pgcluster import LocalCluster

_STACKS = itertools.count()


@pytest.fixture(scope="module")
def stack(pg_cluster: LocalCluster, template_db: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    janitor = DatabaseJanitor(user="postgres", host="127.0.0.1", port=pg_cluster.port,
                              dbname=f"mcp{os.getpid()}_{next(_STACKS)}",
                              template_dbname=template_db)
    janitor.init()
    support = stack_support()
    stacks = support.e2e_helpers().DevStacks(tmp_path_factory.mktemp("mcp-stack"))
    try:
        dev = stacks.start(database_url=pg_cluster.url_for(janitor.dbname), tick_interval=0,
                           job_seconds=0)
        values = dev.wait_ready()
        with httpx.Client(timeout=30) as http:
            yield support.Stack(values, http)
    finally:
        stacks.close()
        janitor.drop()
