"""`sftq dashboard`: opens the dashboard's URL (derived from the API URL) in the default browser,
or prints it where there is none; it never puts the API key in the URL and never imports server
code."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEY = "sftq_" + "a" * 48


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in (
        "DISPLAY", "WAYLAND_DISPLAY", "BROWSER", "SUPABASE_URL", "SFTQ_API_URL", "DASHBOARD_URL",
        "SFTQ_API_KEY")}
    base["PYTHONPATH"] = str(ROOT / "clients")
    return subprocess.run([sys.executable, "-m", "sftq_client", "dashboard", *args],
                          env=base | env, capture_output=True, text=True, timeout=60, check=False)


def test_prints_the_url_where_there_is_no_browser() -> None:
    done = run(SUPABASE_URL="http://127.0.0.1:8080/", SFTQ_API_KEY=KEY)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "http://127.0.0.1:8080/functions/v1/jobs-api/dashboard\n"
    assert "no browser" in done.stderr
    assert KEY not in done.stdout + done.stderr


def test_opens_the_default_browser(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    browser = tmp_path / "browser"
    browser.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {seen}\n")
    browser.chmod(browser.stat().st_mode | stat.S_IEXEC)
    done = run(SFTQ_API_URL="https://example.test/functions/v1/jobs-api", SFTQ_API_KEY=KEY,
               BROWSER=str(browser))
    assert done.returncode == 0, done.stderr
    assert seen.read_text() == "https://example.test/functions/v1/jobs-api/dashboard\n"
    assert done.stdout == "" and "opened" in done.stderr
    assert KEY not in seen.read_text()


def test_url_sources_and_print_url() -> None:
    # --api-url wins; DASHBOARD_URL (what `sftq dev` prints) stands in when none is given.
    assert run("--print-url", "--api-url", "http://h:1/functions/v1/jobs-api",
               DASHBOARD_URL="http://other/").stdout == "http://h:1/functions/v1/jobs-api/dashboard\n"
    assert run("--print-url", DASHBOARD_URL="http://127.0.0.1:9/functions/v1/jobs-api/dashboard",
               SUPABASE_URL="http://x").stdout == "http://127.0.0.1:9/functions/v1/jobs-api/dashboard\n"
    quiet = run("--print-url", SUPABASE_URL="http://127.0.0.1:8080")
    assert quiet.stderr == "" and quiet.stdout.endswith("/functions/v1/jobs-api/dashboard\n")
    missing = run()
    assert missing.returncode == 2 and "API URL" in missing.stderr and "--api-url" in missing.stderr


def test_the_command_imports_no_server_code() -> None:
    code = ("import sys; import sftq_client.cli.dashboard; "
            "print(sorted(m for m in sys.modules if m.startswith('sftq_server')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "clients")}, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
