"""Fixtures for the reliability tests: the simulator (recording answers, injecting faults),
the gateway served on loopback, a guard that brings the session's PostgreSQL back up after a
test restarted it, and a place to put the figures a run produced.

Durations and counts are short by default so the folder runs in CI in a few minutes; the
SFTQ_REL_* variables (docs/reliability.md) make any of them longer for a local soak.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_postgresql.janitor import DatabaseJanitor
from rel_support import ACCOUNT, FaultySim, GatewayThread

from sftq_server.core.settings import Settings
from sftq_server.dev.pgcluster import LocalCluster
from sftq_server.simulator import SimulatorServer

_FIGURES: dict[str, dict[str, Any]] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What a test measured; printed at the end of the run (and written as JSON to
    $SFTQ_REL_FIGURES when set), so docs/reliability.md can quote real numbers."""
    return _FIGURES.setdefault(request.node.name, {})


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("reliability figures")
    for test, values in _FIGURES.items():
        if values:
            terminalreporter.write_line(f"{test}: {json.dumps(values, sort_keys=True)}")
    target = os.environ.get("SFTQ_REL_FIGURES")
    if target:
        Path(target).write_text(json.dumps(_FIGURES, indent=2, sort_keys=True) + "\n")


@pytest.fixture
def make_sim() -> Iterator[Callable[..., tuple[FaultySim, SimulatorServer]]]:
    """Start simulators on loopback; all are stopped at teardown (sleeping faults released)."""
    started: list[tuple[FaultySim, SimulatorServer]] = []

    def make(**kwargs: Any) -> tuple[FaultySim, SimulatorServer]:
        options: dict[str, Any] = {"account_id": ACCOUNT, "seed": 11}
        options.update(kwargs)
        sim = FaultySim(**options)
        server = SimulatorServer(sim).start()
        started.append((sim, server))
        return sim, server

    yield make
    for sim, server in started:
        sim.release()
        server.stop()


@pytest.fixture
def make_gateway() -> Iterator[Callable[..., GatewayThread]]:
    """Serve the gateway (jobs-api, analytics, scheduler-tick) on loopback in a thread."""
    started: list[GatewayThread] = []

    def make(settings: Settings, **kwargs: Any) -> GatewayThread:
        gw = GatewayThread(settings, **kwargs)
        started.append(gw)
        return gw

    yield make
    for gw in started:
        gw.stop()


_module_counter = itertools.count()


def _clone(cluster: LocalCluster, template_db: str) -> tuple[str, DatabaseJanitor]:
    """A fresh database cloned from the migrated template: its URL, and what drops it."""
    name = f"rel{os.getpid()}_{next(_module_counter)}"
    janitor = DatabaseJanitor(user="postgres", host="127.0.0.1", port=cluster.port,
                              dbname=name, template_dbname=template_db)
    janitor.init()
    return cluster.url_for(name), janitor


@pytest.fixture(scope="module")
def module_db_url(pg_cluster: LocalCluster, template_db: str) -> Iterator[str]:
    """One migrated database for a whole module: for the many hostile requests that must
    change nothing (a clone per request would dominate the run time)."""
    url, janitor = _clone(pg_cluster, template_db)
    try:
        yield url
    finally:
        janitor.drop()


@pytest.fixture
def make_db(pg_cluster: LocalCluster, template_db: str) -> Iterator[Callable[[], str]]:
    """Fresh migrated databases on demand (a scenario run more than once), dropped after."""
    janitors: list[DatabaseJanitor] = []

    def make() -> str:
        url, janitor = _clone(pg_cluster, template_db)
        janitors.append(janitor)
        return url

    try:
        yield make
    finally:
        for janitor in janitors:
            janitor.drop()


@pytest.fixture
def cluster_guard(pg_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """For tests that restart the session's PostgreSQL: it is up again afterwards, whatever
    happened, so the tests that follow are not affected."""
    try:
        yield pg_cluster
    finally:
        if not pg_cluster.running():
            pg_cluster.start()
