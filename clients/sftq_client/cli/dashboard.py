"""``sftq dashboard``: open the web dashboard (served by jobs-api at ``/dashboard``) in the default
browser, or print its URL where there is no browser.

The URL is derived from the API URL the other commands use (``--api-url``, ``SFTQ_API_URL``,
``SUPABASE_URL``) or taken from ``DASHBOARD_URL`` (which ``sftq dev`` prints). The API key is never
put in the URL: the page asks for it and keeps it in the browser tab.
"""

from __future__ import annotations

import argparse
import os
import sys
import webbrowser

from .._transport import API_URL_SETTING, Core
from ..errors import ConfigurationError
from ._common import EXIT_OK, CommandFactory, Context, err, out


def dashboard_url(api_url: str | None) -> str:
    """``<jobs-api root>/dashboard``; DASHBOARD_URL when no API URL is given on the command line."""
    if not api_url and os.environ.get("DASHBOARD_URL"):
        return os.environ["DASHBOARD_URL"].strip()
    # The same settings, in the same order, as every other command's client.
    url = Core._base_url_setting(api_url)
    if not url or not url.strip():
        raise ConfigurationError(
            f"no API URL: pass {API_URL_SETTING.ways('cli')}", missing=(API_URL_SETTING,))
    return Core._check_base_url_form(url) + "/dashboard"


def _has_browser() -> bool:
    # On a Linux console (no display, no $BROWSER) webbrowser would start a text browser in this
    # very terminal, or nothing at all: print the URL instead.
    if os.environ.get("BROWSER"):
        return True
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


def _open(url: str) -> bool:
    if not _has_browser():
        return False
    try:
        return bool(webbrowser.open(url, new=2))
    except webbrowser.Error:
        return False


def _cmd_dashboard(args: argparse.Namespace, ctx: Context) -> int:
    url = dashboard_url(args.api_url)
    if not args.print_url and _open(url):
        err(f"opened {url} in your browser; sign in there with your API key")
        return EXIT_OK
    out(url)
    if not args.print_url:
        err("no browser to open here: open the URL above yourself, and sign in with your API key")
    return EXIT_OK


def register(command: CommandFactory) -> None:
    p = command("dashboard", "open the web dashboard in your browser (or print its URL)")
    p.add_argument("--print-url", action="store_true",
                   help="only print the dashboard's URL, do not open a browser")
    p.set_defaults(handler=_cmd_dashboard)
