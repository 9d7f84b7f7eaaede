"""The client (sync and async) and the CLI against the real jobs-api (its WSGI app behind an
httpx transport, dev mode), `sftq webhooks listen` as a real process, and the client's stdlib
verification held to the specification's own library."""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import standardwebhooks
from fn_support import Db
from wh_support import Receiver, wait_until

from sftq_client import AsyncClient, Client, cli
from sftq_client.errors import APIConnectionError, BadRequest, NotFound
from sftq_client.webhooks import WebhookVerificationError, sign_webhook, verify_webhook
from sftq_server import webhooks
from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.dev.pgcluster import free_port
from sftq_server.http.apps import make_jobs_api
from sftq_server.http.web import wsgi_app

BASE = "http://jobs.test/functions/v1/jobs-api"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def transport(dev_settings: Settings, database: Database) -> Iterator[httpx.WSGITransport]:
    app = make_jobs_api(dev_settings, db=database)
    yield httpx.WSGITransport(app=wsgi_app(app))
    app.api.close()


@pytest.fixture
def client(transport: httpx.WSGITransport, alice: str) -> Iterator[Client]:
    with Client(alice, BASE, transport=transport) as c:
        yield c


def run_deliverer(make_deliverer: Callable[..., webhooks.Deliverer]) -> Callable[[], None]:
    """A deliverer running in a thread; returns the function that stops it."""
    stop = threading.Event()
    thread = threading.Thread(target=make_deliverer().run, args=(stop,),
                              kwargs={"poll_interval": 0.05})
    thread.start()

    def halt() -> None:
        stop.set()
        thread.join(15)

    return halt


def test_sync_client(client: Client, bob: str, transport: httpx.WSGITransport,
                     make_receiver: Callable[..., Receiver],
                     make_deliverer: Callable[..., webhooks.Deliverer]) -> None:
    receiver = make_receiver()
    created = client.webhooks.create(receiver.url, events=["job.*"], description="ci")
    assert created.secret.startswith("whsec_") and created.events == ["job.*"]
    assert [e.id for e in client.webhooks.list()] == [created.id]
    got = client.webhooks.get(created.id)
    assert got.enabled and not hasattr(got, "secret")
    queued = client.webhooks.test(created.id)
    assert queued.type == "webhook.test" and queued.outcome == "pending"
    halt = run_deliverer(make_deliverer)
    try:
        (delivery,) = receiver.wait_for(1)
        assert verify_webhook(created.secret, delivery.body, delivery.headers)["type"] == \
            "webhook.test"
        wait_until(lambda: client.webhooks.deliveries(created.id)[0].outcome == "succeeded", 5,
                   "the attempt to be recorded")
    finally:
        halt()
    (attempt,) = client.webhooks.deliveries(created.id, limit=5)
    assert (attempt.status_code, attempt.webhook_id) == (204, queued.webhook_id)
    with Client(bob, BASE, transport=transport) as other, pytest.raises(NotFound):
        other.webhooks.get(created.id)
    with pytest.raises(BadRequest) as bad:
        client.webhooks.create("ftp://x")
    assert bad.value.code == "invalid_url"
    with pytest.raises(TypeError):
        client.webhooks.create(receiver.url, events="job.*")  # type: ignore[arg-type]
    client.webhooks.delete(created.id)
    assert client.webhooks.list() == []
    with pytest.raises(ValueError):
        client.webhooks.get(" ")


def test_creating_is_never_retried(alice: str) -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        raise httpx.ConnectError("boom", request=request)

    with Client(alice, BASE, transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(APIConnectionError):
            c.webhooks.create("https://hooks.example.com/")
        assert calls == ["POST"]  # a retry could make a second endpoint with a second secret
        calls.clear()
        with pytest.raises(APIConnectionError):
            c.webhooks.list()
        assert len(calls) > 1  # reads are retried as usual


def test_async_client(transport: httpx.WSGITransport, alice: str, db: Db) -> None:
    sync = httpx.Client(transport=transport, base_url=BASE)

    def forward(request: httpx.Request) -> httpx.Response:
        answer = sync.send(sync.build_request(request.method, str(request.url),
                                              headers=request.headers, content=request.content))
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    async def main() -> None:
        async with AsyncClient(alice, BASE, transport=httpx.MockTransport(forward)) as c:
            created = await c.webhooks.create("http://127.0.0.1:9/hook")
            assert [e.id for e in await c.webhooks.list()] == [created.id]
            assert (await c.webhooks.get(created.id)).url == "http://127.0.0.1:9/hook"
            assert (await c.webhooks.test(created.id)).outcome == "pending"
            assert len(await c.webhooks.deliveries(created.id, limit=1)) == 1
            await c.webhooks.delete(created.id)
            with pytest.raises(NotFound):
                await c.webhooks.get(created.id)

    try:
        asyncio.run(main())
    finally:
        sync.close()


# --- verification ---------------------------------------------------------------------------

def test_client_verification_agrees_with_the_specifications_library() -> None:
    secret = webhooks.new_secret()
    body = b'{"type": "job.succeeded", "data": {"id": "x"}}'
    now = datetime.now(UTC)
    spec = standardwebhooks.Webhook(secret)
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(int(now.timestamp())),
               "webhook-signature": spec.sign("msg_1", now, body.decode())}
    assert verify_webhook(secret, body, headers) == spec.verify(body, headers)
    # Ours signs what theirs verifies, and the server's signature is the same bytes.
    ours = sign_webhook(secret, "msg_1", int(now.timestamp()), body)
    assert ours == headers["webhook-signature"]
    assert ours == webhooks.sign(secret, "msg_1", int(now.timestamp()), body)
    # Several signatures (a rotation): one good one is enough.
    assert verify_webhook(secret, body, headers | {
        "webhook-signature": "v1,AAAA v2,xyz " + ours})["type"] == "job.succeeded"
    bad_cases = [
        (secret, body + b" ", headers),
        (webhooks.new_secret(), body, headers),
        (secret, body, headers | {"webhook-id": "msg_2"}),
        (secret, body, {k: v for k, v in headers.items() if k != "webhook-signature"}),
        (secret, body, headers | {"webhook-timestamp": str(int(
            (now - timedelta(minutes=6)).timestamp()))}),
        (secret, body, headers | {"webhook-signature": "v1,not-base64!"}),
    ]
    for args in bad_cases:
        with pytest.raises(WebhookVerificationError):
            verify_webhook(*args)
        # (the library lets a malformed signature's binascii.Error through)
        with pytest.raises((standardwebhooks.WebhookVerificationError, binascii.Error)):
            standardwebhooks.Webhook(args[0]).verify(args[1], args[2])
    with pytest.raises(ValueError):
        sign_webhook("whsec_%%%", "m", 0, b"")
    assert base64.b64decode(secret.removeprefix("whsec_"))  # the secret is plain base64


# --- the CLI --------------------------------------------------------------------------------

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def sftq(transport: httpx.WSGITransport, alice: str, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> Run:
    monkeypatch.setenv("SFTQ_API_KEY", alice)
    monkeypatch.setenv("SFTQ_API_URL", BASE)
    monkeypatch.setattr(cli, "client_factory",
                        lambda key, url: Client(key, url, transport=transport))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        assert alice not in out + err
        return code, out, err

    return run


def test_cli(sftq: Run, make_receiver: Callable[..., Receiver],
             make_deliverer: Callable[..., webhooks.Deliverer]) -> None:
    import json

    receiver = make_receiver()
    code, out, err = sftq("webhooks", "add", receiver.url, "--events", "job.queued,job.failed",
                          "job.succeeded", "--description", "mine")
    assert code == 0, err
    secret = next(line.split()[-1] for line in out.splitlines() if line.startswith("secret:"))
    endpoint = next(line.split()[-1] for line in out.splitlines() if line.startswith("id:"))
    assert secret.startswith("whsec_") and "shown only this once" in err
    assert "job.queued, job.failed, job.succeeded" in out

    code, out, _ = sftq("webhooks", "list")
    assert code == 0 and endpoint in out and "yes" in out and secret not in out
    code, out, _ = sftq("webhooks", "list", "--json")
    assert [e["id"] for e in json.loads(out)] == [endpoint]

    halt = run_deliverer(make_deliverer)
    try:
        code, out, err = sftq("webhooks", "test", endpoint)
        assert code == 0, err
        assert "webhook.test" in out and "succeeded" in out and "204" in out
    finally:
        halt()
    verify_webhook(secret, receiver.received[0].body, receiver.received[0].headers)
    code, out, _ = sftq("webhooks", "test", endpoint, "--wait", "0")
    assert code == 0 and "pending" in out
    code, out, _ = sftq("webhooks", "deliveries", endpoint, "--limit", "5")
    assert code == 0 and "WEBHOOK ID" in out and out.count("webhook.test") == 2
    code, out, _ = sftq("webhooks", "deliveries", endpoint, "--json")
    assert {d["outcome"] for d in json.loads(out)} == {"succeeded", "pending"}

    assert sftq("webhooks", "add", receiver.url, "--events", "job.done")[0] == 2
    code, _, err = sftq("webhooks", "add", "ftp://nowhere")
    assert code == 7 and "url must start with" in err
    assert sftq("webhooks", "rm", endpoint)[0] == 0
    code, _, err = sftq("webhooks", "rm", endpoint)
    assert code == 4 and "not found" in err
    assert sftq("webhooks", "listen", "--port", "1")[0] == 2  # no secret


def test_listen_verifies_and_prints_deliveries(
        dev_api: Any, alice: str, db: Db, make_deliverer: Callable[..., webhooks.Deliverer],
        tmp_path: Path) -> None:
    port = free_port()
    resp = dev_api.post("/webhooks", alice,
                        json={"url": f"http://127.0.0.1:{port}/", "events": ["job.*"]})
    secret = resp.json["secret"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFTQ_")}
    # A client-only process: nothing of the server is importable from it.
    env["PYTHONPATH"] = str(ROOT / "clients")
    env["PYTHONUNBUFFERED"] = "1"
    log = tmp_path / "listen.err"
    with open(log, "wb") as errors:
        # Started with SIGINT ignored, as a shell without job control starts a background
        # process: Ctrl-C (SIGINT) must still stop it.
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.modules['sftq_server'] = None; "
             "from sftq_client.cli import main; raise SystemExit(main())",
             "webhooks", "listen", "--port", str(port), "--secret", secret],
            env=env, stdout=subprocess.PIPE, stderr=errors, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        try:
            wait_until(lambda: "listening on" in log.read_text(), 15, "the listener")
            job = dev_api.enqueue(alice)
            dev_api.post(f"/webhooks/{resp.json['id']}/test", alice)
            assert make_deliverer().run(threading.Event(), until_idle=True) == 2
            # The same delivery again (as after a lost answer): printed as a duplicate.
            db.conn.execute("UPDATE sftq.webhook_deliveries SET state = 'pending', "
                            "completed_at = NULL, next_attempt_at = now() "
                            "WHERE type = 'job.queued'")
            assert make_deliverer().run(threading.Event(), until_idle=True) == 1
            # A forged delivery is refused with 400.
            forged = httpx.post(f"http://127.0.0.1:{port}/", content=b'{"type": "x"}', headers={
                "webhook-id": "msg_forged", "webhook-timestamp": str(int(time.time())),
                "webhook-signature": "v1," + base64.b64encode(b"0" * 32).decode()})
            assert forged.status_code == 400
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                out, _ = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired as exc:
                proc.kill()  # never leave it running: fail with what it wrote
                proc.communicate()
                raise AssertionError(
                    f"the listener did not stop on SIGINT\n{log.read_text()}") from exc
    lines = out.splitlines()
    assert proc.returncode == 0, log.read_text()
    assert len(lines) == 3, lines
    assert f"job.queued job {job} QUEUED verified" in lines[0] or \
        f"job.queued job {job} QUEUED verified" in lines[1]
    assert any("webhook.test verified" in line for line in lines)
    assert "duplicate" in lines[2]
    assert "rejected msg_forged" in log.read_text()
    assert log.read_text().rstrip().endswith("stopped")
    statuses = db.conn.execute("SELECT status_code FROM sftq.webhook_attempts").fetchall()
    assert statuses == [(204,)] * 3
