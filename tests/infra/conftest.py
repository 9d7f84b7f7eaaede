"""Fixtures for the infra tests; the helpers live in infra_support.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from infra_support import DEPLOY, FAKE_TOOL, Result, Runner


@pytest.fixture
def fakebin(tmp_path: Path) -> Path:
    d = tmp_path / "fakebin"
    d.mkdir()
    for name in ("gcloud", "psql", "sftq", "curl"):
        p = d / name
        p.write_text(FAKE_TOOL.format(python=sys.executable, name=name))
        p.chmod(0o755)
    return d


@pytest.fixture
def deploy(tmp_path: Path, fakebin: Path) -> Iterator[Runner]:
    """deploy(*args, env={...}, missing_secrets=...) runs infra/deploy.sh in a clean
    environment (none of the caller's settings leak in) with the stand-ins first on PATH."""
    log = tmp_path / "calls.jsonl"
    home = tmp_path / "home"
    home.mkdir()

    def run(*args: str, env: dict[str, str] | None = None, missing_secrets: str = "") -> Result:
        log.write_text("")
        full = {
            "PATH": f"{fakebin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(home),
            "TMPDIR": str(tmp_path),
            "LANG": "C.UTF-8",
            "CLOUDSDK_CONFIG": str(home / "gcloud"),
            "FAKE_LOG": str(log),
            "FAKE_MISSING_SECRETS": missing_secrets,
            "FAKE_CURL_ANSWER": "{}",
            "SFTQ_PYTHON": sys.executable,
        }
        full.update(env or {})
        # The stand-ins must shadow the real tools, or a test could reach a real cloud.
        for tool in ("gcloud", "psql", "sftq", "curl"):
            found = shutil.which(tool, path=full["PATH"])
            assert found is None or Path(found).parent == fakebin, found
        proc = subprocess.run(["bash", str(DEPLOY), *args], env=full, cwd=tmp_path,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        return Result(proc.returncode, proc.stdout, proc.stderr, calls)

    yield run
