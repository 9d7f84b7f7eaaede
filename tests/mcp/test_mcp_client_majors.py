"""The server with both majors of the official Python client: 1.x (the project's venv, where
the server itself runs on mcp 1.x; tests/mcp/test_mcp_http.py and test_mcp_stdio.py drive it
with that client) and 2.x, what `pip install mcp` gives today, in a virtualenv of its own built
once and kept in a cache folder (SFTQ_TEST_CACHE, default ~/.cache/sftq-tests; rebuilt after
a week, so a new 2.x release gets tried). tests/mcp/mcp2_client.py drives the HTTP endpoint and
`sftq mcp` over stdio with it, and docs/agents.md's Python example runs in it as written.

Without the network the 2.x venv cannot be built: the tests then skip, except under CI (the CI
variable set), where they fail."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_support import ROOT, clean_env

MCP2_SPEC = "mcp>=2,<3"
SCRIPT = Path(__file__).resolve().parent / "mcp2_client.py"
REBUILD_AFTER_SECONDS = 7 * 86400
TOOL_NAMES = ["cancel_job", "capacity", "get_job", "job_events", "list_jobs", "queue_position",
              "retry_job", "submit_job", "wait_for_job"]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _cache_root() -> Path:
    base = os.environ.get("SFTQ_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sftq-tests")
    return Path(base) / "mcp2-client"


@pytest.fixture(scope="session")
def mcp2_python() -> Path:
    """The Python of a venv with the 2.x client (built on first use, then reused)."""
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / "venv"
    python = venv / "bin" / "python"
    stamp = venv / "sftq-built"
    with _locked(root / "lock"):
        fresh = stamp.exists() and time.time() - stamp.stat().st_mtime < REBUILD_AFTER_SECONDS
        if not fresh:
            shutil.rmtree(venv, ignore_errors=True)
            try:
                for argv in ([sys.executable, "-m", "venv", str(venv)],
                             [str(python), "-m", "pip", "install", "--quiet",
                              "--disable-pip-version-check", MCP2_SPEC]):
                    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.SubprocessError) as exc:
                detail = getattr(exc, "stderr", "") or str(exc)
                message = f"could not build a venv with {MCP2_SPEC!r}: {detail[-2000:]}"
                shutil.rmtree(venv, ignore_errors=True)
                if os.environ.get("CI"):
                    pytest.fail(message)
                pytest.skip(message)
            stamp.write_text(MCP2_SPEC)
    return python


def _run(python: Path, argv: list[str], env: dict[str, str] | None = None,
         timeout: float = 120) -> dict[str, Any]:
    done = subprocess.run([str(python), *argv], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _client_env() -> dict[str, str]:
    # The 2.x venv's own packages only: nothing of the project's PYTHONPATH.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _check(seen: dict[str, Any], *, progress: bool) -> None:
    from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS

    assert seen["client_version"].startswith("2."), seen
    assert seen["server"] == "finetune-queue"
    assert seen["protocol_version"] in SUPPORTED_PROTOCOL_VERSIONS
    assert seen["tools"] == TOOL_NAMES
    assert seen["submitted"] == {"kind": "SFT", "state": "QUEUED"}  # "sft" taken in any case
    assert seen["waited"]["timed_out"] is True
    if progress:
        assert seen["waited"]["progress"] >= 2
    assert seen["missing"] == "not_found"
    assert seen["bad_arguments"] == "invalid_arguments"
    assert seen["cancelled"] == {"state": "CANCELLED", "pending": False}
    assert seen["cancel_again"] == "job_terminal"


def test_the_project_runs_the_server_on_the_1x_line() -> None:
    # The server's code is written for 1.x (pyproject pins mcp<2); the 1.x client is the one
    # the other tests in this folder use.
    assert importlib.metadata.version("mcp").startswith("1.")


def test_a_2x_client_over_http(stack: Any, mcp2_python: Path) -> None:
    user = stack.user(f"mcp2-http-{uuid.uuid4().hex[:8]}")
    seen = _run(mcp2_python, [str(SCRIPT), "http", f"{stack.base}/functions/v1/mcp", user],
                env=_client_env())
    _check(seen, progress=True)


def test_a_2x_client_over_stdio(stack: Any, mcp2_python: Path) -> None:
    user = stack.user(f"mcp2-stdio-{uuid.uuid4().hex[:8]}")
    server = {"command": sys.executable, "args": ["-m", "sftq_client", "mcp"],
              "env": clean_env(SUPABASE_URL=stack.base, SFTQ_API_KEY=user)}
    seen = _run(mcp2_python, [str(SCRIPT), "stdio", json.dumps(server)], env=_client_env())
    _check(seen, progress=True)


def python_example() -> str:
    text = (ROOT / "docs" / "agents.md").read_text()
    after = text[text.index("From Python, with the `mcp` package's own client"):]
    match = re.search(r"```python\n(.*?)```", after, re.S)
    assert match, "docs/agents.md has no Python example"
    return match.group(1)


def test_the_docs_python_example_runs_as_written(stack: Any, mcp2_python: Path,
                                                 tmp_path: Path) -> None:
    user = stack.user(f"mcp2-docs-{uuid.uuid4().hex[:8]}")
    script = tmp_path / "example.py"
    script.write_text(python_example())
    env = _client_env() | {"SUPABASE_URL": stack.base, "SFTQ_API_KEY": user}
    for _ in range(2):  # the same idempotency key twice: the same job
        done = subprocess.run([str(mcp2_python), str(script)], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-4000:]
        job_id, state = done.stdout.split()
        assert state == "QUEUED"
    jobs = stack.http.get(f"{stack.api}/jobs", headers=stack.auth(user)).json()
    assert [j["id"] for j in jobs] == [job_id]
    stack.http.delete(f"{stack.api}/jobs/{job_id}", headers=stack.auth(user))


def test_the_docs_name_the_protocol_versions_the_server_speaks() -> None:
    from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS

    text = " ".join((ROOT / "docs" / "agents.md").read_text().split())
    listed = re.search(r"speaks the MCP protocol versions ([0-9-, and]+)", text)
    assert listed, "docs/agents.md must say which protocol versions the server speaks"
    assert set(re.findall(r"\d{4}-\d{2}-\d{2}", listed.group(1))) == set(
        SUPPORTED_PROTOCOL_VERSIONS)
