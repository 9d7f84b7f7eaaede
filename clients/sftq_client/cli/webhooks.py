"""``sftq webhooks add | list | rm | test | deliveries | listen``: your webhook endpoints, and a
small local receiver that verifies and prints deliveries (handy with ``sftq dev``)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..models import WEBHOOK_EVENTS, WebhookDelivery, WebhookEndpoint
from ..webhooks import WebhookVerificationError, sign_webhook, verify_webhook
from ._common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WAIT_TIMEOUT,
    CommandFactory,
    Context,
    UsageError,
    add_connection_options,
    add_json,
    err,
    fields,
    one_line,
    out,
    positive_int,
    print_json,
    table,
)

# Bodies larger than this are refused by `listen` (deliveries are a few hundred bytes).
_LISTEN_MAX_BODY = 1_048_576


def _events(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    events = [e.strip() for v in values for e in v.split(",") if e.strip()]
    unknown = [e for e in events if e not in WEBHOOK_EVENTS]
    if unknown:
        raise UsageError(f"unknown event(s): {', '.join(unknown)}; "
                         f"choose from {', '.join(WEBHOOK_EVENTS)}")
    return events


def _endpoint_fields(e: WebhookEndpoint) -> list[tuple[str, object]]:
    return [
        ("id", e.id),
        ("url", e.url),
        ("events", ", ".join(e.events)),
        ("description", e.description),
        ("enabled", "yes" if e.enabled else "no"),
        ("created_at", e.created_at),
        ("disabled_at", e.disabled_at),
        ("disabled_reason", e.disabled_reason),
    ]


def _cmd_add(args: argparse.Namespace, ctx: Context) -> int:
    created = ctx.client.webhooks.create(args.url, events=_events(args.events),
                                         description=args.description)
    if args.json:
        print_json(created)
    else:
        out(fields([*_endpoint_fields(created), ("secret", created.secret)]))
    err(f"note: the secret of {created.id} is shown only this once; keep it where your "
        "receiver can read it (it verifies the webhook-signature header)")
    return EXIT_OK


def _cmd_list(args: argparse.Namespace, ctx: Context) -> int:
    endpoints = ctx.client.webhooks.list()
    if args.json:
        print_json(endpoints)
        return EXIT_OK
    if not endpoints:
        err("no webhook endpoints; add one with: sftq webhooks add URL")
        return EXIT_OK
    out(table(["ID", "ENABLED", "EVENTS", "URL", "NOTE"],
              [(e.id, "yes" if e.enabled else "no", ",".join(e.events), e.url,
                one_line(e.disabled_reason or e.description, 60)) for e in endpoints]))
    return EXIT_OK


def _cmd_rm(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.webhooks.delete(args.endpoint_id)
    out(f"deleted webhook endpoint {args.endpoint_id}")
    return EXIT_OK


def _delivery_rows(items: list[WebhookDelivery]) -> list[tuple[object, ...]]:
    return [(d.attempted_at or d.created_at, d.type, d.webhook_id, d.attempt, d.outcome,
             d.status_code, None if d.duration_ms is None else f"{d.duration_ms} ms",
             d.next_retry_at, one_line(d.error, 60)) for d in items]


_DELIVERY_HEADERS = ["TIME", "TYPE", "WEBHOOK ID", "TRY", "OUTCOME", "STATUS", "TOOK",
                     "NEXT RETRY", "ERROR"]


def _cmd_test(args: argparse.Namespace, ctx: Context) -> int:
    queued = ctx.client.webhooks.test(args.endpoint_id)
    err(f"queued {queued.type} delivery {queued.webhook_id}")
    result = queued
    deadline = time.monotonic() + args.wait
    while result.outcome == "pending" and time.monotonic() < deadline:
        time.sleep(0.5)
        for item in ctx.client.webhooks.deliveries(args.endpoint_id, limit=20):
            if item.webhook_id == queued.webhook_id and item.outcome != "pending":
                result = item
                break
    if args.json:
        print_json(result)
    else:
        out(table(_DELIVERY_HEADERS, _delivery_rows([result])))
    if result.outcome == "succeeded":
        return EXIT_OK
    if result.outcome == "pending":
        if args.wait:
            err(f"not delivered within {args.wait:g}s; follow it with: "
                f"sftq webhooks deliveries {args.endpoint_id}")
            return EXIT_WAIT_TIMEOUT
        return EXIT_OK
    return EXIT_ERROR


def _cmd_deliveries(args: argparse.Namespace, ctx: Context) -> int:
    items = ctx.client.webhooks.deliveries(args.endpoint_id, limit=args.limit)
    if args.json:
        print_json(items)
    elif not items:
        err("no deliveries yet")
    else:
        out(table(_DELIVERY_HEADERS, _delivery_rows(items)))
    return EXIT_OK


# ---- listen -------------------------------------------------------------------------------------


def _describe(event: Any) -> str:
    if not isinstance(event, dict):
        return "?"
    raw = event.get("data")
    data: dict[str, Any] = raw if isinstance(raw, dict) else {}
    text = str(event.get("type"))
    if data.get("id"):
        text += f" job {data['id']} {data.get('state')}"
    return text


def serve_listener(host: str, port: int, secret: str, *, as_json: bool = False,
                   ready: threading.Event | None = None,
                   stop: threading.Event | None = None) -> int:
    """Receive deliveries on host:port, verify each and print one line per delivery (or its
    JSON). Answers 204 to a verified delivery, 400 to one that does not verify."""
    seen: set[str] = set()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "sftq-webhooks-listen"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
            pass

        def _answer(self, status: int, text: str = "") -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - stdlib's name
            length = self.headers.get("Content-Length", "")
            if not length.isdigit() or int(length) > _LISTEN_MAX_BODY:
                self._answer(413 if length.isdigit() else 411)
                return
            body = self.rfile.read(int(length))
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            webhook_id = self.headers.get("webhook-id", "-")
            try:
                event = verify_webhook(secret, body, dict(self.headers.items()))
            except WebhookVerificationError as exc:
                with lock:
                    err(f"{now} rejected {webhook_id}: {exc}")
                self._answer(400, f"{exc}\n")
                return
            with lock:
                duplicate = webhook_id in seen
                seen.add(webhook_id)
                if as_json:
                    out(json.dumps({"webhook_id": webhook_id, "duplicate": duplicate,
                                    "event": event}))
                else:
                    note = " (duplicate: already received)" if duplicate else ""
                    out(f"{now} {webhook_id} {_describe(event)} verified{note}")
                sys.stdout.flush()
            self._answer(204)

    class Server(ThreadingHTTPServer):
        daemon_threads = True

    try:
        server = Server((host, port), Handler)
    except OSError as exc:
        err(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}")
        return EXIT_USAGE
    url_host = f"[{host}]" if ":" in host else host
    err(f"listening on http://{url_host}:{server.server_address[1]}/ ; add it with: "
        f"sftq webhooks add http://{url_host}:{server.server_address[1]}/ (Ctrl-C stops)")
    if ready is not None:
        ready.set()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              daemon=True)
    thread.start()
    stopper = stop or threading.Event()
    # Ctrl-C and SIGTERM stop it, set here rather than left to Python's default: a process
    # started in the background by a shell that has no job control inherits SIGINT ignored,
    # and would otherwise keep listening after Ctrl-C or a supervisor's SIGTERM.
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: stopper.set())
    try:
        while not stopper.wait(0.2):
            pass
        if previous:
            err("stopped")
    except KeyboardInterrupt:
        err("stopped")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.shutdown()
        server.server_close()
    return EXIT_OK


def _cmd_listen(args: argparse.Namespace, ctx: Context) -> int:
    secret = args.secret or os.environ.get("SFTQ_WEBHOOK_SECRET")
    if not secret:
        raise UsageError("pass --secret whsec_... (or set SFTQ_WEBHOOK_SECRET): the secret "
                         "`sftq webhooks add` printed")
    try:
        sign_webhook(secret, "msg_check", 0, b"")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return serve_listener(args.host, args.port, secret, as_json=args.json)


def register(command: CommandFactory) -> None:
    p = command("webhooks", "signed notifications when your jobs change state")
    sub = p.add_subparsers(dest="webhooks_command", metavar="<command>", title="commands",
                           required=True)

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        a = sub.add_parser(name, help=help_text, description=help_text)
        add_connection_options(a, top_level=False)
        return a

    a = action("add", "add an endpoint; prints its signing secret (shown once)")
    a.add_argument("url", metavar="URL", help="where to POST deliveries (https:// in production)")
    a.add_argument("--events", nargs="+", metavar="EVENT",
                   help=f"what to deliver: {', '.join(WEBHOOK_EVENTS)} (space- or "
                   "comma-separated; default: job.succeeded job.failed job.cancelled)")
    a.add_argument("--description", metavar="TEXT", help="a note for yourself")
    add_json(a)
    a.set_defaults(handler=_cmd_add)

    a = action("list", "your endpoints, newest first")
    add_json(a)
    a.set_defaults(handler=_cmd_list)

    a = action("rm", "delete an endpoint")
    a.add_argument("endpoint_id", metavar="ID")
    a.set_defaults(handler=_cmd_rm)

    a = action("test", "send a webhook.test delivery and show how it went")
    a.add_argument("endpoint_id", metavar="ID")
    a.add_argument("--wait", type=float, default=15.0, metavar="S",
                   help="wait up to S seconds for the attempt (default 15; 0: do not wait)")
    add_json(a)
    a.set_defaults(handler=_cmd_test)

    a = action("deliveries", "recent delivery attempts, newest first")
    a.add_argument("endpoint_id", metavar="ID")
    a.add_argument("--limit", type=positive_int, metavar="N", help="at most N (default 50)")
    add_json(a)
    a.set_defaults(handler=_cmd_deliveries)

    a = action("listen", "receive deliveries locally, verify and print them")
    a.add_argument("--port", type=positive_int, required=True, metavar="N")
    a.add_argument("--secret", metavar="S",
                   help="the endpoint's secret, whsec_... (default: $SFTQ_WEBHOOK_SECRET)")
    a.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    add_json(a)
    a.set_defaults(handler=_cmd_listen)
