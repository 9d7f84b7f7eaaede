"""Nothing lost when the delivering process dies: SIGKILL it after its claim committed and
before it sent, then again after it sent and before it recorded the answer. Every delivery
still arrives (at least once: the receiver sees the second window's deliveries twice, with the
same webhook-id each time, which is what receivers deduplicate on)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest
from fn_support import Api, Db
from wh_support import WEBHOOKS_KEY, Receiver, verify, wait_until

HERE = Path(__file__).resolve().parent
N = 5


class Proc:
    """A subprocess whose stdout lines are collected by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def wait_lines(self, predicate: Callable[[str], bool], n: int, timeout: float) -> list[str]:
        got = [line for line in self.seen if predicate(line)]
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        try:
            while len(got) < n:
                if deadline.is_set() or self.proc.poll() is not None and self.lines.empty():
                    raise AssertionError(f"wanted {n} lines, got {got}; all: {self.seen}")
                try:
                    line = self.lines.get(timeout=0.1)
                except queue.Empty:
                    continue
                self.seen.append(line)
                if predicate(line):
                    got.append(line)
        finally:
            timer.cancel()
        return got

    def _close(self) -> None:
        self.reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._close()
        return code


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


def test_sigkill_between_commit_and_send_and_between_send_and_record_loses_nothing(
        dev_api: Api, db: Db, alice: str, db_url: str, procs: list[Proc],
        make_receiver: Callable[..., Receiver]) -> None:
    env = os.environ | {"SFTQ_WEBHOOKS_KEY": WEBHOOKS_KEY, "SFTQ_WEBHOOKS_ALLOW_PRIVATE": "true",
                        "PYTHONUNBUFFERED": "1"}
    held = threading.Event()
    receiver = make_receiver(hold=held)
    resp = dev_api.post("/webhooks", alice, json={"url": receiver.url, "events": ["job.queued"]})
    secret = resp.json["secret"]  # type: ignore[index]
    for _ in range(N):
        dev_api.enqueue(alice)  # each commit wrote its delivery

    # 1. Claimed (the lease is committed), killed before anything is sent.
    first = Proc([sys.executable, str(HERE / "wh_worker.py"), "pause", db_url], env)
    procs.append(first)
    claimed = first.wait_lines(lambda s: s.startswith("claimed "), N, timeout=30)
    assert len(set(claimed)) == N
    assert db.one("SELECT count(*) FROM sftq.webhook_deliveries WHERE lease_token IS NOT NULL") \
        == N
    first.kill()
    assert receiver.received == []

    # 2. Sent (the receiver has every request), killed before any answer is recorded.
    second = Proc([sys.executable, str(HERE / "wh_worker.py"), "normal", db_url], env)
    procs.append(second)
    receiver.wait_for(N, timeout=30)  # the first worker's leases ran out, the second sent
    second.kill()
    assert db.one("SELECT count(*) FROM sftq.webhook_attempts") == 0
    assert db.one("SELECT count(*) FROM sftq.webhook_deliveries WHERE state = 'pending'") == N

    # 3. The real worker, once those leases run out, delivers everything again.
    held.set()
    worker = Proc([sys.executable, "-m", "sftq_server.cli.dev", "deliver",
                   "--database-url", db_url, "--poll-interval", "0.1"], env)
    procs.append(worker)
    wait_until(lambda: db.one("SELECT count(*) FROM sftq.webhook_deliveries "
                              "WHERE state = 'succeeded'") == N, 40, "every delivery to succeed")
    assert worker.stop() == 0

    got = receiver.received
    per_id = Counter(r.webhook_id for r in got)
    assert len(per_id) == N  # every delivery arrived ...
    assert set(per_id.values()) == {2}  # ... at least once: twice, with the same webhook-id
    for r in got:
        verify(secret, r)
    assert {r.json["type"] for r in got} == {"job.queued"}
    outcomes = db.conn.execute("SELECT outcome, count(*) FROM sftq.webhook_attempts "
                               "GROUP BY outcome").fetchall()
    assert outcomes == [("succeeded", N)]
