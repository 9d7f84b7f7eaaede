"""Helpers for the stream tests: SQL setup of users and job lives, and an SSE reader."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
from httpx_sse import ServerSentEvent, connect_sse

PAYLOAD = '{"dataset": "accounts/a/datasets/d", "baseModel": "m"}'


@dataclass
class Sql:
    conn: psycopg.Connection[Any]
    keys: dict[str, str] = field(default_factory=dict)

    def one(self, query: str, *params: Any) -> Any:
        row = self.conn.execute(query, params).fetchone()
        return None if row is None else row[0]

    def user(self, name: str) -> str:
        self.conn.execute("SELECT sftq.create_user(%s)", (name,))
        key = str(self.one("SELECT key FROM sftq.issue_key(%s)", name))
        self.keys[name] = key
        return key

    def uid(self, name: str) -> int:
        return int(self.one("SELECT id FROM sftq.users WHERE name = %s", name))

    def enqueue(self, name: str, gpus: int = 4) -> str:
        return str(self.one("SELECT id FROM sftq.enqueue(%s, 'SFT', %s::jsonb, NULL, %s)",
                            self.uid(name), PAYLOAD, gpus))

    def admit(self, gpus: int = 1000) -> list[str]:
        return [str(r[0]) for r in self.conn.execute(
            "SELECT job_id FROM sftq.admit(%s)", (gpus,)).fetchall()]

    def submitted(self, job: str) -> None:
        self.conn.execute("SELECT sftq.record_submitted(%s, %s, 'JOB_STATE_PENDING')",
                          (job, f"accounts/a/supervisedFineTuningJobs/sftq-{job}"))

    def provider(self, job: str, state: str) -> None:
        self.conn.execute("SELECT sftq.record_provider_state(%s, %s)", (job, state))

    def cancel(self, name: str, job: str) -> None:
        self.conn.execute("SELECT * FROM sftq.cancel(%s, %s)", (self.uid(name), job))

    def tick(self) -> None:
        """A tick's record, begun and finished: its end writes the queue frames."""
        tick = self.one("SELECT sftq.tick_begin('test')")
        self.conn.execute("SELECT sftq.tick_finish(%s, '{}'::jsonb)", (tick,))


def headers(key: str | None, last_event_id: str | None = None) -> dict[str, str]:
    h: dict[str, str] = {}
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    if last_event_id is not None:
        h["Last-Event-ID"] = last_event_id
    return h


class Reader:
    """Reads one stream in a thread (httpx-sse) and keeps every event and comment seen."""

    def __init__(self, url: str, key: str, last_event_id: str | None = None,
                 stop_after: int | None = None) -> None:
        self.url = url
        self.key = key
        self.last_event_id = last_event_id
        self.stop_after = stop_after
        self.events: list[ServerSentEvent] = []
        self.status: int | None = None
        self.content_type: str | None = None
        self.error: BaseException | None = None
        self.closed_by_server = False
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._client = httpx.Client(timeout=httpx.Timeout(30.0, read=30.0))
        self._thread = threading.Thread(target=self._run, name="sse-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with connect_sse(self._client, "GET", self.url,
                             headers=headers(self.key, self.last_event_id)) as source:
                self.status = source.response.status_code
                self.content_type = source.response.headers.get("content-type")
                for event in source.iter_sse():
                    if event.event == "message" and not event.data:
                        # httpx-sse dispatches the blank line after a `: ping` comment once an
                        # id was seen (the spec says not to): a heartbeat, not a frame.
                        continue
                    with self._changed:
                        self.events.append(event)
                        self._changed.notify_all()
                    if self._stop.is_set() or (
                            self.stop_after is not None and len(self.events) >= self.stop_after):
                        return
                self.closed_by_server = True
        except BaseException as exc:  # noqa: BLE001 (kept for the test to see)
            self.error = exc
        finally:
            self._client.close()
            with self._changed:
                self._changed.notify_all()

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> list[ServerSentEvent]:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: predicate(self.events) or not self._thread.is_alive(), timeout)
        assert ok and predicate(self.events), (
            f"timed out; got {[(e.event, e.id) for e in self.events]} error={self.error!r}")
        return list(self.events)

    def wait_events(self, n: int, timeout: float = 10.0) -> list[ServerSentEvent]:
        return self.wait_for(lambda evs: len(evs) >= n, timeout)

    def join(self, timeout: float = 10.0) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not close"

    def stop(self) -> None:
        self._stop.set()
        self._client.close()
        self._thread.join(5)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def data(event: ServerSentEvent) -> Any:
    return json.loads(event.data)
