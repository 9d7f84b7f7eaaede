"""Installing the package: pip builds its metadata without a warning."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, clean_env


def test_the_metadata_builds_without_warnings(tmp_path: Path) -> None:
    # What `pip install` runs first, with every warning an error: it used to warn that the
    # license table form is deprecated (an SPDX string is the form setuptools wants now).
    pytest.importorskip("setuptools", minversion="77")
    build = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            "import sys; from setuptools import build_meta as b; "
            "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    metadata = next(tmp_path.glob("*.dist-info")) / "METADATA"
    assert "License-Expression: MIT" in metadata.read_text()


def test_the_wheel_builds_every_folder_it_ships_without_a_warning(tmp_path: Path) -> None:
    # The first `make dev` printed about a hundred lines of "Package would be ignored" for the
    # skill's and the dashboard's folders: importable to Python, absent from `packages`.
    # Built from a copy, so the checkout's build/ folder is left alone.
    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("functions", "clients"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = tmp_path / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))",
            str(out),
        ],
        cwd=src,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    log = build.stdout + build.stderr
    assert build.returncode == 0, log[-3000:]
    assert "would be ignored" not in log, log[-3000:]
    assert "SetuptoolsDeprecationWarning" not in log, log[-3000:]
    with zipfile.ZipFile(next(out.glob("*.whl"))) as wheel:
        names = set(wheel.namelist())
    # What the folders hold still ships: the skill (`sftq skill install`) and the dashboard.
    for shipped in (
        "sftq_client/skills/finetune-queue/SKILL.md",
        "sftq_client/skills/finetune-queue/references/dpo.md",
        "sftq_server/dashboard/index.html",
        "sftq_server/dashboard/app.js",
        "sftq_server/dashboard/style.css",
        "sftq_server/dashboard/icon.svg",
        "sftq_server/preflight/fireworks_schema.json",
    ):
        assert shipped in names, sorted(n for n in names if "dashboard" in n or "skills" in n)
