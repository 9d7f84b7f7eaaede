"""Build-once-on-first-use, for the function entry points: a cold start imports and
connects nothing until the first request, and every later request reuses what it built."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Lazy(Generic[T]):
    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._value: T | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        if self._value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._build()
        return self._value

    def close(self) -> None:
        """Close what was built, if it was (and has a close()); the next get() builds anew."""
        with self._lock:
            value, self._value = self._value, None
        close = getattr(value, "close", None)
        if callable(close):
            close()
