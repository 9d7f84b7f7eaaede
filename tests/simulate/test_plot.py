"""`--plot FILE.svg`: the figure is written, is SVG, and carries the series it promises."""

from __future__ import annotations

import builtins
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from sftq_server.simulate import plot as plot_module  # noqa: E402
from sftq_server.simulate.plot import PlotUnavailable, plot  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def result() -> dict[str, Any]:
    timeline = [
        {"t": 0, "queue_depth": 0, "gpus_in_use": 0, "quota": 8},
        {"t": 600, "queue_depth": 3, "gpus_in_use": 8, "quota": 8},
        {"t": 4000, "queue_depth": 1, "gpus_in_use": 6, "quota": 12},
        {"t": 9000, "queue_depth": 0, "gpus_in_use": 0, "quota": 12},
    ]
    return {
        "timeline": timeline,
        "users": {"heavy1": {"waits": [0, 120, 3600, 7200, 5000], "p50": 3600},
                  "light1": {"waits": [30.0, 60.0]},
                  "idle": {"waits": []}},
        "something_else": 1,
    }


def texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return ["".join(node.itertext()) for node in root.iter(f"{SVG}text")]


def test_the_svg_parses_and_names_every_series(tmp_path: Path) -> None:
    path = tmp_path / "replay.svg"
    plot(result(), path)
    labels = texts(path)
    for label in ("GPUs in use", "quota", "queue depth", "wait (hours)",
                  "wait distribution per user (jobs admitted)"):
        assert label in labels, labels
    # Each user is on the waits panel with the number of its waits.
    assert {"heavy1 (5)", "light1 (2)", "idle (0)"} <= set(labels), labels
    assert "virtual time (hours from the trace's start)" in labels


def test_the_same_result_draws_the_same_bytes(tmp_path: Path) -> None:
    plot(result(), tmp_path / "a.svg")
    plot(result(), tmp_path / "b.svg")
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()


def test_a_long_replay_counts_in_days_and_png_works(tmp_path: Path) -> None:
    long = result()
    long["timeline"].append({"t": 7 * 86400, "queue_depth": 0, "gpus_in_use": 0, "quota": 12})
    plot(long, tmp_path / "long.svg", title="cap 2")
    labels = texts(tmp_path / "long.svg")
    assert "virtual time (days from the trace's start)" in labels and "cap 2" in labels
    plot(long, tmp_path / "long.png")
    assert (tmp_path / "long.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(("broken", "says"), [
    ({"users": {}}, "no timeline"),
    ({"timeline": [{"t": 0, "queue_depth": 1}], "users": {}}, "gpus_in_use, quota"),
    ({"timeline": [], "users": {"a": {"p50": 3}}}, "'a' has no list of waits"),
])
def test_a_result_without_what_the_plot_reads_says_so(tmp_path: Path, broken: dict[str, Any],
                                                      says: str) -> None:
    with pytest.raises(ValueError, match=says):
        plot(broken, tmp_path / "x.svg")


def test_without_matplotlib_the_error_names_the_extra(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] == "matplotlib":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(PlotUnavailable, match=r"pip install 'finetune-queue\[plot\]'"):
        plot(result(), tmp_path / "x.svg")
    assert not (tmp_path / "x.svg").exists()
    assert plot_module.EXTRA == "pip install 'finetune-queue[plot]'"
