"""The dashboard's files ship inside the package: what setuptools' build_py step copies, which is
what a wheel carries, holds every file of functions/sftq_server/dashboard/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sftq_server.http.routes.dashboard import STATIC_DIR

ROOT = Path(__file__).resolve().parents[2]


def test_a_wheel_carries_every_dashboard_file(tmp_path: Path) -> None:
    # build_py is the step of bdist_wheel that lays out the packages and their data; run alone it
    # needs neither the network nor the wheel package. A fresh egg-base keeps a stale file list
    # (SOURCES.txt) of an earlier build from standing in for package-data.
    build = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", "from setuptools import setup; setup()", "-q",
         "egg_info", "--egg-base", str(tmp_path), "build_py", "--build-lib",
         str(tmp_path / "lib")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert build.returncode == 0, build.stderr[-3000:]
    shipped = {p.name for p in (tmp_path / "lib" / "sftq_server" / "dashboard").iterdir()}
    expected = {p.name for p in STATIC_DIR.iterdir() if p.is_file()}
    assert expected and shipped == expected
    assert {"index.html", "app.js", "style.css"} <= shipped
