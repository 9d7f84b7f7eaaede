"""The Dockerfile, without a Docker engine: read statically (what it installs, copies, and
runs, and that its command is the setup docs/performance.md recommends), then its command run
here as it would run in the image (granian, PYTHONPATH=functions) against a migrated database."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from infra_support import ROOT

from sftq_server.pgcluster import free_port

DOCKERFILE = ROOT / "Dockerfile"
TICK_SECRET = "container-tick-secret-0123456789abcdef"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def cmd() -> list[str]:
    found = [args for word, args in instructions() if word == "CMD"]
    assert len(found) == 1
    value = json.loads(found[0])  # exec form: no shell between Cloud Run's signals and granian
    assert isinstance(value, list)
    return [str(v) for v in value]


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_image_runs_the_recommended_server() -> None:
    argv = cmd()
    assert argv[0] == "granian"
    assert option(argv, "--interface") == "wsgi"
    assert argv[-1] == "sftq_server.gateway:create_app" and "--factory" in argv
    assert option(argv, "--host") == "0.0.0.0"
    # docs/performance.md: "Recommended setup on 2 cores: granian, 2 worker processes x 2
    # blocking threads (granian --interface wsgi --workers 2 --blocking-threads 2 ...)".
    doc = (ROOT / "docs" / "performance.md").read_text()
    recommended = re.search(r"`granian --interface wsgi --workers (\d+) --blocking-threads (\d+)",
                            doc)
    assert recommended is not None, "docs/performance.md no longer names its recommendation"
    assert (option(argv, "--workers"), option(argv, "--blocking-threads")) == recommended.groups()
    port = option(argv, "--port")
    assert ("EXPOSE", port) in instructions()


def test_the_image_is_built_from_the_right_things() -> None:
    steps = instructions()
    assert steps[0] == ("FROM", "python:3.11-slim")  # the runtime the functions are tested on
    copies = [args for word, args in steps if word == "COPY"]
    assert "functions/ functions/" in copies and "docs/openapi.json docs/openapi.json" in copies
    assert not any(c.split()[0] in (".", "sql", "sql/", "tests", "tests/") for c in copies)
    env = " ".join(args for word, args in steps if word == "ENV")
    assert "PYTHONPATH=/app/functions" in env
    users = [args for word, args in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    install = next(args for word, args in steps if word == "RUN" and "pip install" in args)
    assert "-c constraints.txt" in install  # deploy.sh pins what was tested
    wanted = dict(re.findall(r'"([a-z][a-z0-9_-]*(?:\[[a-z]+\])?)(>=[0-9.]+)"', install))
    # Every package the functions import, with the floors pyproject.toml states.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["server"] + \
        project["optional-dependencies"]["bench"]
    floors = dict(re.match(r"([a-z][a-z0-9_-]*(?:\[[a-z]+\])?)(.*)", d).groups()  # type: ignore[union-attr]
                  for d in declared if not d.startswith("finetune-queue"))
    for package in ("psycopg[binary]", "psycopg-pool", "pydantic", "httpx", "werkzeug", "granian"):
        assert wanted.get(package) == floors[package], package
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests", "**/__pycache__"} <= set(ignored)
    assert "functions" not in ignored and "docs" not in ignored


@pytest.fixture
def granian_cmd() -> list[str]:
    binary = Path(sys.executable).parent / "granian"
    if not binary.exists():
        pytest.fail("granian is not installed beside this Python (it is in the dev extra)")
    argv = cmd()
    argv[0] = str(binary)
    argv[argv.index("--host") + 1] = "127.0.0.1"
    return argv


def _start(argv: list[str], port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    full = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT / "functions"),
            "PYTHONDONTWRITEBYTECODE": "1", **env}
    return subprocess.Popen(argv, cwd=ROOT, env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture
def served(granian_cmd: list[str], db_url: str) -> Iterator[str]:
    port = free_port()
    proc = _start(granian_cmd, port, {"DATABASE_URL": db_url, "SFTQ_TICK_SECRET": TICK_SECRET,
                                      "FIREWORKS_API_KEY": "fw-fake", "FIREWORKS_ACCOUNT_ID": "a",
                                      "FIREWORKS_BASE_URL": "http://127.0.0.1:9"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/functions/v1/jobs-api/health", timeout=2).status_code:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "granian did not answer"
            time.sleep(0.2)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_command_serves_the_three_functions(served: str) -> None:
    health = httpx.get(f"{served}/functions/v1/jobs-api/health", timeout=10)
    assert health.status_code == 200 and health.json()["database"] == "ok"
    assert httpx.get(f"{served}/functions/v1/analytics/health", timeout=10).status_code == 200
    assert httpx.get(f"{served}/functions/v1/jobs-api/openapi.json", timeout=10).status_code == 200
    denied = httpx.post(f"{served}/functions/v1/scheduler-tick", timeout=10,
                        headers={"Authorization": "Bearer wrong"})
    assert denied.status_code == 401 and denied.json()["code"] == "unauthorized"


def test_the_command_refuses_to_start_with_a_short_tick_secret(granian_cmd: list[str],
                                                               db_url: str) -> None:
    proc = _start(granian_cmd, free_port(), {"DATABASE_URL": db_url,
                                             "SFTQ_TICK_SECRET": "short-secret-0123456789"})
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert b"at least 32" in out and b"short-secret-0123456789" not in out, out[-2000:]


def test_the_documented_docker_command_matches(granian_cmd: list[str]) -> None:
    """docs/operations.md shows the image's command; it must be the Dockerfile's."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    shown = " ".join(shlex.quote(a) for a in cmd())
    assert shown in doc, shown
