"""Fixtures for the dashboard's tests. The browser tests run against a live `sftq dev` (started as
tests/e2e does, on a clone of the session's migrated template) and a headless chromium."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import ARTIFACTS, Browser
from pytest_postgresql.janitor import DatabaseJanitor
from stack_support import Stack, e2e_helpers

from sftq_server.dev.pgcluster import LocalCluster

_SHOTS: list[Path] = []
_STACKS = itertools.count()


def _stack(pg_cluster: LocalCluster, template_db: str, tmp_path_factory: pytest.TempPathFactory,
           env: dict[str, str] | None = None) -> Iterator[Stack]:
    janitor = DatabaseJanitor(user="postgres", host="127.0.0.1", port=pg_cluster.port,
                              dbname=f"dash{os.getpid()}_{next(_STACKS)}",
                              template_dbname=template_db)
    janitor.init()
    stacks = e2e_helpers().DevStacks(tmp_path_factory.mktemp("dash-stack"))
    try:
        dev = stacks.start(database_url=pg_cluster.url_for(janitor.dbname), tick_interval=0,
                           job_seconds=0, env=env)
        values = dev.wait_ready()
        with httpx.Client(timeout=30) as http:
            yield Stack(values, http)
    finally:
        stacks.close()
        janitor.drop()


@pytest.fixture(scope="module")
def stack(pg_cluster: LocalCluster, template_db: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from _stack(pg_cluster, template_db, tmp_path_factory)


@pytest.fixture(scope="module")
def checked_stack(pg_cluster: LocalCluster, template_db: str,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack with the pre-flight check on (the tests' default is off), as a user's has it."""
    yield from _stack(pg_cluster, template_db, tmp_path_factory, {"SFTQ_PREFLIGHT": "on"})


@pytest.fixture
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.getbasetemp() / "dashboard-screenshots"
    if path not in _SHOTS:
        _SHOTS.append(path)
    return path


@pytest.fixture
def browser(shots: Path) -> Iterator[Browser]:
    b = Browser(shots)
    try:
        yield b
    finally:
        b.quit()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    taken = [p for p in _SHOTS if p.is_dir() and any(p.iterdir())]
    for path in taken:
        terminalreporter.write_line(f"dashboard screenshots: {path} (copied to {ARTIFACTS})")
