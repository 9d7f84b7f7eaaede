"""Deliveries to real receivers on loopback: every one verified with the Standard Webhooks
library, retries with the same webhook-id, disabling, the safety rules (timeout, no redirects,
64 KiB, destinations re-checked at every attempt and connected to as checked, TLS names
verified), the secret never logged, and a slow receiver never holding up the others."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import standardwebhooks
from fn_support import Api, Db
from wh_support import (
    PUBLIC_IP,
    Connections,
    FakeResolver,
    Receiver,
    self_signed,
    verify,
)

from sftq_server import webhooks
from sftq_server.core.settings import Settings

MakeDeliverer = Callable[..., webhooks.Deliverer]


def add(api: Api, key: str, url: str, events: list[str] | None = None) -> tuple[str, str]:
    body: dict[str, Any] = {"url": url}
    if events is not None:
        body["events"] = events
    resp = api.post("/webhooks", key, json=body)
    assert resp.status_code == 201, resp.get_data(as_text=True)
    return resp.json["id"], resp.json["secret"]  # type: ignore[index]


def drain(deliverer: webhooks.Deliverer) -> int:
    return deliverer.run(threading.Event(), until_idle=True)


def due_now(db: Db) -> None:
    """Time travel: every waiting retry is due now."""
    db.conn.execute("UPDATE sftq.webhook_deliveries SET next_attempt_at = clock_timestamp() "
                    "WHERE state = 'pending' AND lease_token IS NULL")


def attempts(api: Api, key: str, endpoint: str) -> list[dict[str, Any]]:
    resp = api.get(f"/webhooks/{endpoint}/deliveries", key)
    assert resp.status_code == 200
    return list(resp.json)  # type: ignore[arg-type]


def test_every_event_type_is_delivered_and_verifies(
        dev_api: Api, db: Db, alice: str, make_receiver: Callable[..., Receiver],
        make_deliverer: MakeDeliverer) -> None:
    receiver = make_receiver()
    endpoint, secret = add(dev_api, alice, receiver.url, ["job.*"])
    ok = dev_api.enqueue(alice)
    db.admit()
    db.submitted(ok)
    db.provider_state(ok, "JOB_STATE_COMPLETED", after=60)
    bad = dev_api.enqueue(alice)
    db.admit(after=61)
    db.submitted(bad)
    db.provider_state(bad, "JOB_STATE_FAILED", "boom", after=120)
    gone = dev_api.enqueue(alice)
    dev_api.delete(f"/jobs/{gone}", alice)
    assert dev_api.post(f"/webhooks/{endpoint}/test", alice).status_code == 202
    assert drain(make_deliverer()) == 9

    got = receiver.wait_for(9)
    seen = []
    for r in got:
        payload = verify(secret, r)  # raises unless the signature and timestamp verify
        assert payload == r.json
        assert r.headers["content-type"] == "application/json"
        assert r.headers["webhook-signature"].startswith("v1,")
        assert r.headers["webhook-id"].startswith("msg_")
        assert abs(int(r.headers["webhook-timestamp"]) - time.time()) < 60
        assert r.path == "/hook"
        seen.append((payload["type"], payload["data"].get("id"), payload["data"].get("state")))
    assert sorted(seen, key=str) == sorted([
        ("job.queued", ok, "QUEUED"), ("job.admitted", ok, "PROGRESS"),
        ("job.succeeded", ok, "SUCCESS"), ("job.queued", bad, "QUEUED"),
        ("job.admitted", bad, "PROGRESS"), ("job.failed", bad, "FAIL"),
        ("job.queued", gone, "QUEUED"), ("job.cancelled", gone, "CANCELLED"),
        ("webhook.test", None, None)], key=str)
    assert len({r.webhook_id for r in got}) == 9
    # A body that was tampered with, or another secret, does not verify.
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(secret).verify(got[0].body + b" ", got[0].headers)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(webhooks.new_secret()).verify(got[0].body, got[0].headers)
    outcomes = attempts(dev_api, alice, endpoint)
    assert {o["outcome"] for o in outcomes} == {"succeeded"}
    assert {o["status_code"] for o in outcomes} == {204}


def test_a_terminal_only_subscription_gets_the_three_endings(
        dev_api: Api, db: Db, alice: str, bob: str, make_receiver: Callable[..., Receiver],
        make_deliverer: MakeDeliverer) -> None:
    receiver = make_receiver()
    _, secret = add(dev_api, alice, receiver.url)  # default events
    job = dev_api.enqueue(alice)
    dev_api.enqueue(bob)  # someone else's job: never delivered to alice
    dev_api.delete(f"/jobs/{job}", alice)
    drain(make_deliverer())
    (got,) = receiver.wait_for(1)
    assert verify(secret, got)["type"] == "job.cancelled"
    time.sleep(0.2)
    assert len(receiver.received) == 1


def test_retries_carry_the_same_webhook_id(dev_api: Api, db: Db, alice: str,
                                           make_receiver: Callable[..., Receiver],
                                           make_deliverer: MakeDeliverer) -> None:
    receiver = make_receiver(replies=[503, 500, 429, 204])
    endpoint, secret = add(dev_api, alice, receiver.url, ["job.queued"])
    dev_api.enqueue(alice)
    deliverer = make_deliverer()
    for n in range(1, 5):
        assert drain(deliverer) == 1
        assert len(receiver.wait_for(n)) == n
        assert drain(deliverer) == 0  # not due again before its retry time
        due_now(db)
    got = receiver.received
    assert len({r.webhook_id for r in got}) == 1
    for r in got:
        verify(secret, r)
    assert [r.body for r in got] == [got[0].body] * 4  # the same body, re-signed each time
    history = attempts(dev_api, alice, endpoint)
    assert [(h["attempt"], h["outcome"], h["status_code"]) for h in history] == [
        (4, "succeeded", 204), (3, "retrying", 429), (2, "retrying", 500), (1, "retrying", 503)]
    assert all(h["webhook_id"] == got[0].webhook_id for h in history)
    assert history[1]["next_retry_at"] is not None and history[0]["next_retry_at"] is None


def test_410_disables_the_endpoint_at_once(dev_api: Api, db: Db, alice: str,
                                           make_receiver: Callable[..., Receiver],
                                           make_deliverer: MakeDeliverer) -> None:
    receiver = make_receiver(replies=[410])
    endpoint, _ = add(dev_api, alice, receiver.url, ["job.queued"])
    dev_api.enqueue(alice)
    drain(make_deliverer())
    shown = dev_api.get(f"/webhooks/{endpoint}", alice).json
    assert shown["enabled"] is False and "410" in shown["disabled_reason"]
    dev_api.enqueue(alice)
    due_now(db)
    assert drain(make_deliverer()) == 0
    assert len(receiver.received) == 1
    assert dev_api.post(f"/webhooks/{endpoint}/test", alice).status_code == 409


def test_repeated_failure_disables_after_three_days(dev_api: Api, db: Db, alice: str,
                                                    make_receiver: Callable[..., Receiver],
                                                    make_deliverer: MakeDeliverer) -> None:
    receiver = make_receiver(replies=[503] * 20)
    endpoint, _ = add(dev_api, alice, receiver.url, ["job.queued"])
    dev_api.enqueue(alice)
    deliverer = make_deliverer()
    drain(deliverer)
    # Nine retries later, three days on: the last attempt fails too.
    db.conn.execute("UPDATE sftq.webhook_deliveries SET attempts = 9, "
                    "created_at = clock_timestamp() - interval '3 days 1 second', "
                    "next_attempt_at = clock_timestamp()")
    drain(deliverer)
    assert len(receiver.received) == 2
    shown = dev_api.get(f"/webhooks/{endpoint}", alice).json
    assert shown["enabled"] is False
    assert "3 days" in shown["disabled_reason"] and "503" in shown["disabled_reason"]
    assert attempts(dev_api, alice, endpoint)[0]["outcome"] == "failed"


def test_other_4xx_fail_without_retry(dev_api: Api, db: Db, alice: str,
                                      make_receiver: Callable[..., Receiver],
                                      make_deliverer: MakeDeliverer) -> None:
    receiver = make_receiver(replies=[400])
    endpoint, _ = add(dev_api, alice, receiver.url, ["job.queued"])
    dev_api.enqueue(alice)
    drain(make_deliverer())
    due_now(db)
    assert drain(make_deliverer()) == 0
    (last,) = attempts(dev_api, alice, endpoint)
    assert (last["outcome"], last["status_code"]) == ("failed", 400)
    assert dev_api.get(f"/webhooks/{endpoint}", alice).json["enabled"] is True


def test_redirects_are_not_followed(dev_api: Api, alice: str,
                                    make_receiver: Callable[..., Receiver],
                                    make_deliverer: MakeDeliverer) -> None:
    elsewhere = make_receiver()
    receiver = make_receiver(replies=[(307, {"Location": elsewhere.url}, b"")])
    endpoint, _ = add(dev_api, alice, receiver.url, ["job.queued"])
    dev_api.enqueue(alice)
    drain(make_deliverer())
    (last,) = attempts(dev_api, alice, endpoint)
    assert last["status_code"] == 307 and "redirects are not followed" in last["error"]
    assert last["outcome"] == "failed"
    assert elsewhere.connections == 0


def test_a_receiver_that_does_not_answer_times_out(dev_api: Api, alice: str,
                                                   make_receiver: Callable[..., Receiver],
                                                   make_deliverer: MakeDeliverer) -> None:
    assert webhooks.TIMEOUT_SECONDS == 10.0
    receiver = make_receiver(hold=threading.Event())
    endpoint, _ = add(dev_api, alice, receiver.url, ["job.queued"])
    dev_api.enqueue(alice)
    started = time.monotonic()
    drain(make_deliverer(timeout=1.0, lease_seconds=5.0))
    took = time.monotonic() - started
    (last,) = attempts(dev_api, alice, endpoint)
    assert last["outcome"] == "retrying" and last["status_code"] is None
    assert "no answer within 1s" in last["error"]
    assert 0.9 <= took < 3.0 and 900 <= last["duration_ms"] < 3000


def test_a_trickling_receiver_is_cut_off_at_the_deadline(make_deliverer: MakeDeliverer) -> None:
    """One byte a while: every read returns, but the whole exchange still ends on time."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            for _ in range(100):
                if stop.wait(0.2):
                    return
                try:
                    conn.sendall(b"H")
                except OSError:
                    return

    threading.Thread(target=trickle, daemon=True).start()
    target = webhooks.parse_url(f"http://127.0.0.1:{server.getsockname()[1]}/", allow_http=True)
    started = time.monotonic()
    answer = webhooks.send(target, ["127.0.0.1"], [], b"{}", timeout=1.0)
    stop.set()
    server.close()
    assert answer.status is None and "no answer within 1s" in (answer.error or "")
    assert time.monotonic() - started < 2.0


def test_at_most_64_kib_of_an_answer_is_read() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    sent = [0]

    def flood() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while sent[0] < 4_000_000:
                    conn.sendall(b"X-Flood: " + b"a" * 1000 + b"\r\n")
                    sent[0] += 1011
            except OSError:
                pass

    threading.Thread(target=flood, daemon=True).start()
    received = [0]

    class Counting:
        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def recv(self, n: int) -> bytes:
            data = self.sock.recv(n)
            received[0] += len(data)
            return data

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    def connector(address: str, port: int, timeout: float) -> Any:
        return Counting(webhooks.connect_tcp(address, port, timeout))

    target = webhooks.parse_url(f"http://127.0.0.1:{server.getsockname()[1]}/", allow_http=True)
    answer = webhooks.send(target, ["127.0.0.1"], [], b"{}", timeout=5.0,
                           connector=connector)  # type: ignore[arg-type]
    server.close()
    assert answer.status is None and "64 KiB" in (answer.error or "")
    assert received[0] <= webhooks.MAX_RESPONSE_BYTES == 65536


def test_a_slow_receiver_never_delays_the_others(dev_api: Api, db: Db, alice: str, bob: str,
                                                 make_receiver: Callable[..., Receiver],
                                                 make_deliverer: MakeDeliverer) -> None:
    held = threading.Event()
    slow = make_receiver(hold=held)
    fast = make_receiver()
    add(dev_api, alice, slow.url, ["job.queued"])
    add(dev_api, bob, fast.url, ["job.queued"])
    for _ in range(8):
        dev_api.enqueue(alice)  # eight deliveries queued up for the slow receiver first
    deliverer = make_deliverer(concurrency=4, per_endpoint=2, timeout=8.0, lease_seconds=10.0)
    stop = threading.Event()
    worker = threading.Thread(target=deliverer.run, args=(stop,), kwargs={"poll_interval": 0.05})
    worker.start()
    try:
        slow.wait_for(2)
        started = time.monotonic()
        for _ in range(5):
            dev_api.enqueue(bob)
        fast.wait_for(5, timeout=3.0)
        assert time.monotonic() - started < 2.0
        # The slow endpoint never holds more than its bound at once.
        assert len(slow.received) == 2
    finally:
        held.set()
        stop.set()
        worker.join(15)
    assert not worker.is_alive()


def test_the_secret_is_never_logged(dev_api: Api, db: Db, alice: str,
                                    make_receiver: Callable[..., Receiver],
                                    make_deliverer: MakeDeliverer,
                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    receiver = make_receiver(replies=[503, 204])
    url = receiver.url + "?token=PATHSECRET"
    endpoint, secret = add(dev_api, alice, url, ["job.*"])
    lines: list[str] = []
    deliverer = make_deliverer(on_outcome=lambda o: lines.append(o.line()))
    dev_api.enqueue(alice)
    drain(deliverer)
    due_now(db)
    drain(deliverer)
    got = receiver.wait_for(2)
    sealed = db.one("SELECT secret_sealed FROM sftq.webhook_endpoints WHERE id = %s", endpoint)
    logged = caplog.text + "\n".join(lines)
    assert lines and "webhook msg_" in logged
    for needle in (secret, secret.removeprefix("whsec_"), sealed,
                   *(r.headers["webhook-signature"].split(",", 1)[1] for r in got),
                   "PATHSECRET"):
        assert needle not in logged
    assert f"127.0.0.1:{receiver.port}" in lines[0]  # the host is named, nothing more


# --- destinations at delivery time ----------------------------------------------------------

@pytest.fixture
def no_system_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the system resolver was asked: {args!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_a_name_that_rebinds_to_loopback_is_refused_before_connecting(
        api: Api, db: Db, alice: str, settings: Settings, resolver: FakeResolver,
        connections: Connections, make_receiver: Callable[..., Receiver],
        make_deliverer: MakeDeliverer, no_system_dns: None) -> None:
    receiver = make_receiver()
    resolver.table["rebind.example"] = [PUBLIC_IP]
    endpoint, _ = add(api, alice, f"https://rebind.example:{receiver.port}/hook", ["job.queued"])
    resolver.table["rebind.example"] = ["127.0.0.1"]  # DNS changed after the check at creation
    api.enqueue(alice)
    asked = len(resolver.asked)
    drain(make_deliverer(settings))  # production mode
    assert len(resolver.asked) == asked + 1  # checked again at the attempt
    assert connections.made == [] and receiver.connections == 0
    (last,) = attempts(api, alice, endpoint)
    assert last["outcome"] == "retrying" and last["status_code"] is None
    assert "destination refused" in last["error"] and "loopback" in last["error"]


@pytest.mark.parametrize("addresses", [["10.0.0.1"], ["169.254.169.254"], [PUBLIC_IP, "::1"]])
def test_production_deliveries_never_connect_to_private_addresses(
        api: Api, db: Db, alice: str, settings: Settings, resolver: FakeResolver,
        connections: Connections, make_deliverer: MakeDeliverer, no_system_dns: None,
        addresses: list[str]) -> None:
    resolver.table["hooks.example.com"] = [PUBLIC_IP]
    endpoint, _ = add(api, alice, "https://hooks.example.com/hook", ["job.queued"])
    resolver.table["hooks.example.com"] = addresses
    api.enqueue(alice)
    drain(make_deliverer(settings))
    assert connections.made == []
    (last,) = attempts(api, alice, endpoint)
    assert "destination refused" in last["error"]


def test_production_connects_to_the_checked_address_and_verifies_the_name(
        api: Api, db: Db, alice: str, settings: Settings, resolver: FakeResolver,
        make_receiver: Callable[..., Receiver], make_deliverer: MakeDeliverer,
        tmp_path: Path, no_system_dns: None) -> None:
    import ssl

    cert, key = self_signed(tmp_path, "hooks.example.com")
    receiver = make_receiver(tls=(cert, key))
    # The "internet": the public address the name resolves to leads to the loopback receiver.
    internet = Connections(redirect={PUBLIC_IP: receiver.port})
    resolver.table["hooks.example.com"] = [PUBLIC_IP]
    endpoint, secret = add(api, alice, "https://hooks.example.com/finetune?x=1", ["job.queued"])
    api.enqueue(alice)
    trust = ssl.create_default_context(cafile=cert)
    drain(make_deliverer(settings, connector=internet, ssl_context=trust))
    (got,) = receiver.wait_for(1)
    verify(secret, got)
    assert internet.made == [(PUBLIC_IP, 443)]
    assert got.headers["host"] == "hooks.example.com" and got.path == "/finetune?x=1"

    # A certificate for another name is refused, pinned address or not.
    other_cert, other_key = self_signed(tmp_path, "other.example.com")
    impostor = make_receiver(tls=(other_cert, other_key))
    api.delete(f"/webhooks/{endpoint}", alice)
    endpoint, _ = add(api, alice, "https://hooks.example.com/finetune", ["job.queued"])
    api.enqueue(alice)
    internet.redirect[PUBLIC_IP] = impostor.port
    trust_both = ssl.create_default_context(cafile=cert)
    trust_both.load_verify_locations(other_cert)
    drain(make_deliverer(settings, connector=internet, ssl_context=trust_both))
    (last,) = attempts(api, alice, endpoint)
    assert last["status_code"] is None and "TLS failed" in last["error"]
    assert impostor.received == []


def test_dev_mode_pins_the_resolved_address_too(
        dev_api: Api, alice: str, resolver: FakeResolver, make_receiver: Callable[..., Receiver],
        make_deliverer: MakeDeliverer, no_system_dns: None) -> None:
    receiver = make_receiver()
    resolver.table["receiver.test"] = ["127.0.0.1"]
    _, secret = add(dev_api, alice, f"http://receiver.test:{receiver.port}/in", ["job.queued"])
    dev_api.enqueue(alice)
    drain(make_deliverer())
    (got,) = receiver.wait_for(1)
    verify(secret, got)
    assert got.headers["host"] == f"receiver.test:{receiver.port}"
    assert resolver.asked == ["receiver.test"]


def test_the_production_destination_rules() -> None:
    refused = ["127.0.0.1", "127.8.9.1", "10.0.0.1", "172.31.255.255", "192.168.0.1",
               "169.254.169.254", "169.254.1.1", "100.64.0.1", "100.100.100.200", "0.0.0.0",
               "224.0.0.251", "255.255.255.255", "192.0.2.1", "198.18.0.1", "::1", "::",
               "fe80::1", "fc00::1", "fd00:ec2::254", "ff02::1", "::ffff:127.0.0.1",
               "::ffff:10.0.0.1", "64:ff9b::a00:1", "2002:7f00:1::", "2001:db8::1",
               "not-an-ip"]
    allowed = [PUBLIC_IP, "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8",
               "64:ff9b::808:808"]
    assert [a for a in refused if webhooks.address_refusal(a) is None] == []
    assert [a for a in allowed if webhooks.address_refusal(a) is not None] == []


def test_the_delivery_function_runs_a_pass(dev_settings: Settings, database: Any, dev_api: Api,
                                           alice: str, make_receiver: Callable[..., Receiver],
                                           connections: Connections) -> None:
    from werkzeug.test import Client

    receiver = make_receiver()
    _, secret = add(dev_api, alice, receiver.url, ["job.queued"])
    dev_api.enqueue(alice)
    app = webhooks.make_deliver_app(dev_settings, db=database, connector=connections)
    client = Client(app)
    assert client.get("/").status_code == 405
    assert client.post("/").status_code == 401
    assert client.post("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    resp = client.post("/", headers={"Authorization": f"Bearer {dev_settings.tick_secret}"})
    assert resp.status_code == 200 and json.loads(resp.get_data())["attempts"] == 1
    verify(secret, receiver.wait_for(1)[0])
    unset = webhooks.make_deliver_app(dataclasses.replace(dev_settings, tick_secret=""),
                                      db=database)
    assert Client(unset).post("/", headers={"Authorization": "Bearer x"}).status_code == 503


def test_a_non_ascii_path_is_sent_percent_encoded(dev_api: Api, alice: str,
                                                  make_receiver: Callable[..., Receiver],
                                                  make_deliverer: MakeDeliverer) -> None:
    receiver = make_receiver()
    _, secret = add(dev_api, alice, receiver.url + "/caf\u00e9?x=\u00e9", ["job.queued"])
    dev_api.enqueue(alice)
    drain(make_deliverer())
    (got,) = receiver.wait_for(1)
    verify(secret, got)
    assert got.path == "/hook/caf%C3%A9?x=%C3%A9"


def test_an_unexpected_error_is_recorded_and_retried(dev_api: Api, alice: str,
                                                     make_receiver: Callable[..., Receiver],
                                                     make_deliverer: MakeDeliverer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = make_receiver()
    endpoint, _ = add(dev_api, alice, receiver.url, ["job.queued"])
    dev_api.enqueue(alice)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(webhooks.deliverer, "send", broken)
    drain(make_deliverer())
    (last,) = attempts(dev_api, alice, endpoint)
    assert last["outcome"] == "retrying" and "internal error" in last["error"]
