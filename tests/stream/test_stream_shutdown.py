"""The local gateway's stream loop shuts down cleanly however a closing stream races it.

A WSGI server thread closing a stream body schedules work on the stream loop at any moment,
up to the gateway stopping that loop. A task that the loop accepted but never ran would
leave its coroutine un-awaited: a RuntimeWarning from the garbage collector, which this suite
turns into an error (it once failed CI that way, at random)."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from sftq_server.stream.hub import WsgiStreams, _in_loop


def test_a_task_started_just_before_the_loop_stops_is_finished_not_abandoned() -> None:
    streams = WsgiStreams(lambda: None)  # type: ignore[arg-type, return-value]
    loop, _ = streams._start()
    ran = threading.Event()
    gate = threading.Event()
    loop.call_soon_threadsafe(gate.wait)  # hold the loop while the race is set up

    async def finish() -> None:
        ran.set()

    # Queued in this order: the body's callback that makes its task, then the shutdown's stop;
    # the task's first step lands after the stop, so the loop thread never runs it.
    closing = _in_loop(loop, finish)
    closer = threading.Thread(target=streams.close)
    closer.start()
    deadline = time.monotonic() + 5
    while len(loop._ready) < 3 and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)
    gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert loop.is_closed()
    # The abandoned task was cancelled and awaited, so its coroutine is closed, not pending.
    assert closing.cancelled() or ran.is_set()
    gc.collect()


def test_scheduling_on_a_closed_loop_raises_at_once() -> None:
    streams = WsgiStreams(lambda: None)  # type: ignore[arg-type, return-value]
    loop, _ = streams._start()
    streams.close()

    async def never() -> None:  # pragma: no cover - must not be made
        raise AssertionError

    with pytest.raises(RuntimeError):
        _in_loop(loop, never)
