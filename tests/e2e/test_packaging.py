"""Installing the package: pip builds its metadata without a warning."""

from __future__ import annotations

import subprocess
import sys
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
