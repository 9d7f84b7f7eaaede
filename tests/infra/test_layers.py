"""The rooms stay rooms: the import contracts in pyproject.toml hold (lint-imports), no module
of the server or the client takes part in an import circle, and no module imports another's
private (`_name`) names. docs/architecture.md explains the rules; these tests enforce them."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"sftq_server": ROOT / "functions" / "sftq_server",
            "sftq_client": ROOT / "clients" / "sftq_client"}


def _env() -> dict[str, str]:
    return os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "functions"),
                                                       str(ROOT / "clients")])}


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def _cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), i.e. the circles."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if not other.startswith(package):
                continue
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in modules:
        if module not in index:
            visit(module)
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_circles(package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for path in (ROOT / "functions", ROOT / "clients"):
        monkeypatch.syspath_prepend(str(path))
    # Imports made only for type checking count too: a circle there is still a tangle to read.
    graph = grimp.build_graph(package, cache_dir=None)
    assert _cycles(graph, package) == [], f"import circles in {package}"


def _private_imports(package: str, folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 0 and not (node.module or "").startswith(package):
                continue  # another library's names are its business
            base = path.parent
            for _ in range(max(node.level - 1, 0)):
                base = base.parent
            for alias in node.names:
                # A package's private module (`from . import _transport`) is its own to use.
                is_module = node.level > 0 and not node.module and (
                    (base / f"{alias.name}.py").exists() or (base / alias.name).is_dir())
                if alias.name.startswith("_") and not alias.name.startswith("__") \
                        and not is_module:
                    where = path.relative_to(ROOT)
                    found.append(f"{where}:{node.lineno} imports {alias.name} from "
                                 f"{'.' * node.level}{node.module or ''}")
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_private_names_imported_across_modules(package: str) -> None:
    assert _private_imports(package, PACKAGES[package]) == []
