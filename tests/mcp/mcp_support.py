"""What the MCP tests share: tests/dashboard's Stack (a live `sftq dev`) and tests/e2e's
environment scrubbing, loaded by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def stack_support() -> ModuleType:
    """tests/dashboard/stack_support.py (Stack: ticks, submissions, /_sim, users)."""
    return _load("sftq_mcp_stack_support", ROOT / "tests" / "dashboard" / "stack_support.py")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a subprocess, without a developer's credentials or URLs."""
    env: dict[str, str] = stack_support().e2e_helpers().clean_env(**extra)
    return env
