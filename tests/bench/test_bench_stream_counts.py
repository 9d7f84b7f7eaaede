"""The stream section's burst check counts every frame by id, per stream: a repeated id and a
missing one each fail the stream (bench/sec_stream.py, frame_counts)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from sec_stream import frame_counts  # noqa: E402

BEFORE = ["1", "2", "3"]


def test_every_wanted_frame_once_passes() -> None:
    assert frame_counts([*BEFORE, "7", "9"], 3, {"7", "9"}) == (0, 0, 0)


def test_a_repeated_burst_frame_is_counted() -> None:
    assert frame_counts([*BEFORE, "7", "9", "7"], 3, {"7", "9"}) == (1, 0, 0)


def test_an_earlier_frame_sent_again_is_a_repeat() -> None:
    assert frame_counts([*BEFORE, "7", "2", "9"], 3, {"7", "9"}) == (1, 0, 0)


def test_a_missing_frame_is_counted() -> None:
    assert frame_counts([*BEFORE, "9"], 3, {"7", "9"}) == (0, 1, 0)


def test_a_frame_nobody_expected_is_counted() -> None:
    assert frame_counts([*BEFORE, "7", "8", "9"], 3, {"7", "9"}) == (0, 0, 1)
