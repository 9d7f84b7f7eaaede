"""Driving Debian's chromium with Selenium for the dashboard's browser tests.

Chromium runs headless as root, so it needs --no-sandbox; the closed network of CI refuses the
connections its background services make, so those are switched off; every browser gets a fresh
profile folder and is stopped (with any process left under that profile) when the test ends.
Console messages and every request the page makes (Chrome's own network log, and the page's
resource timing entries) are collected so tests can check there is no error and no other origin.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--disable-default-apps", "--disable-extensions",
    "--no-default-browser-check", "--password-store=basic", "--use-mock-keychain",
)
ROOT = Path(__file__).resolve().parents[2]
# Screenshots are kept here too (git-ignored), besides the pytest basetemp.
ARTIFACTS = ROOT / "tests" / "artifacts"


def browser_paths() -> tuple[str, str]:
    """chromium and chromedriver from Debian (installed by .ci/run); skip where absent, except in
    CI, where their absence is a failure."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        message = "chromium and chromedriver are needed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return chromium, driver


def _pids_using(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                found.append(int(entry.name))
    return found


class Browser:
    """One headless chromium, its console and its requests."""

    def __init__(self, shots: Path, width: int = 1440, height: int = 1000,
                 dark: bool = False) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        chromium, driver = browser_paths()
        self.profile = tempfile.mkdtemp(prefix="sftq-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                     f"--window-size={width},{height}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        self.service = Service(executable_path=driver)
        self.driver = webdriver.Chrome(service=self.service, options=options)
        self.driver.set_page_load_timeout(30)
        self.shots = shots
        self.console: list[dict[str, Any]] = []
        self.requests: list[str] = []
        # Per screenshot, how far the page is wider than the window (> 0: a sideways scroll).
        self.overflow: dict[str, int] = {}
        if dark:
            self.color_scheme("dark")

    # -- lifecycle ---------------------------------------------------------------------------
    def quit(self) -> None:
        with contextlib.suppress(Exception):
            self.driver.quit()
        # Nothing may outlive the test: any process still on this profile goes too.
        deadline = time.monotonic() + 10
        while (left := _pids_using(self.profile)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in _pids_using(self.profile):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.profile, ignore_errors=True)
        assert not left or not _pids_using(self.profile)

    # -- what happened ------------------------------------------------------------------------
    def collect(self) -> None:
        self.console += self.driver.get_log("browser")
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message.get("method") == "Network.requestWillBeSent":
                self.requests.append(message["params"]["request"]["url"])

    def console_errors(self, allow: Callable[[str], bool] = lambda m: False) -> list[str]:
        self.collect()
        return [e["message"] for e in self.console
                if e["level"] == "SEVERE" and not allow(e["message"])]

    def foreign_requests(self, origin: str) -> list[str]:
        """Requests to anything but `origin`, from the network log and the resource timings."""
        self.collect()
        timing = self.driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")
        urls = set(self.requests) | set(timing)
        # The browser's own pages (the blank tab it opens with) and data: URLs (its screenshots)
        # are not requests to any origin.
        internal = ("chrome:", "chrome-untrusted:", "chrome-extension:", "devtools:", "about:",
                    "data:", "blob:")
        return sorted(u for u in urls if not u.startswith(internal) and _origin(u) != origin)

    # -- doing things -------------------------------------------------------------------------
    def get(self, url: str) -> None:
        self.driver.get(url)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = predicate()
            except Exception as exc:  # stale elements while the page redraws
                last = exc
                value = None
            if value:
                return value
            time.sleep(0.1)
        state = self.js("return [document.getElementById('live')?.textContent, "
                        "document.documentElement.dataset.frames, location.hash]")
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r}); "
                             f"live, frames, route: {state}; console: {self.console_errors()}")

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, css))

    def text(self, css: str) -> str:
        return str(self.find(css).text)

    def click(self, css: str) -> None:
        """Click, trying again if the page redrew the element meanwhile."""
        def attempt() -> bool:
            self.find(css).click()
            return True

        self.wait(attempt, f"a click on {css}", timeout=10)

    def texts(self, css: str) -> list[str]:
        """Texts of every match, read in one go (the page may redraw between two reads)."""
        found: list[str] = self.js(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText)", css)
        return found

    def attrs(self, css: str, name: str) -> list[str | None]:
        """An attribute of every match, read in one go."""
        found: list[str | None] = self.js(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.getAttribute("
            "arguments[1]))", css, name)
        return found

    def present(self, css: str) -> bool:
        return bool(self.find_all(css))

    def go(self, hash_route: str) -> None:
        """Follow an in-page link, as a click on the navigation would."""
        self.js("location.hash = arguments[0]", hash_route)

    def sign_in(self, url: str, key: str) -> None:
        self.get(url)
        self.wait(lambda: self.present("#key"), "the sign-in form")
        self.find("#key").send_keys(key)
        self.find("form.signin button[type=submit]").click()
        self.wait(lambda: self.present("#nav:not([hidden])"), "the navigation after sign-in")

    def color_scheme(self, scheme: str) -> None:
        self.driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {
            "features": [{"name": "prefers-color-scheme", "value": scheme}]})

    def screenshot(self, name: str, width: int, height: int = 900) -> Path:
        """A full-page screenshot at this width, kept under basetemp and tests/artifacts."""
        self.driver.set_window_size(width, height)
        time.sleep(0.4)  # let a resize redraw the charts
        full = self.js("return Math.max(document.documentElement.scrollHeight, arguments[0])",
                       height)
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": int(min(full, 4000)), "deviceScaleFactor": 1,
            "mobile": width < 500})
        time.sleep(0.3)
        self.overflow[f"{name}-{width}"] = int(self.js(
            "return document.documentElement.scrollWidth - window.innerWidth"))
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}-{width}.png"
        self.driver.save_screenshot(str(path))
        self.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, ARTIFACTS / path.name)
        return path


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def origin_of(url: str) -> str:
    return _origin(url)
