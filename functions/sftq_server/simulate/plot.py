"""`sftq simulate --plot FILE.svg`: the replay's timeline and its waits, in one figure.

Three panels share what a reader compares: GPUs in use against the quota, the queue's depth
over the same virtual hours, and the distribution of each user's waits (box: the middle half;
line: the median; whiskers: 5th to 95th percentile; dots: beyond). The figure reads these keys
of a replay's result, nothing else:

- `result["timeline"]`: a list of `{"t": seconds, "queue_depth": jobs, "gpus_in_use": GPUs,
  "quota": GPUs}`, one point per change; each value holds until the next point;
- `result["users"]`: `{name: {"waits": [seconds, ...], ...}}`.

matplotlib is an optional extra (`pip install 'finetune-queue[plot]'`): the replay itself
needs none of it. The format follows the file's extension (.svg, .png, .pdf).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

EXTRA = "pip install 'finetune-queue[plot]'"
TIMELINE_KEYS = ("t", "queue_depth", "gpus_in_use", "quota")


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def plot(result: Mapping[str, Any], path: str | Path, *, title: str | None = None) -> None:
    """Draw the result's timeline and per-user waits into `path` (SVG unless it says else)."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable(f"--plot needs matplotlib, which is not installed; {EXTRA}"
                              ) from None
    timeline = _timeline(result)
    waits = _waits(result)
    path = Path(path)
    hours = [point["t"] / 3600 for point in timeline]
    scale, unit = (24.0, "days") if hours and hours[-1] > 72 else (1.0, "hours")
    xs = [h / scale for h in hours]

    # Text stays text in the SVG (not outlines): smaller, searchable, and what the test reads.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "sftq",
                                "font.size": 9}):
        figure = Figure(figsize=(10, 9), layout="constrained")
        gpus_axes, depth_axes, waits_axes = figure.subplots(
            3, 1, height_ratios=(2, 1.3, 2))
        gpus_axes.step(xs, [p["gpus_in_use"] for p in timeline], where="post",
                       color="tab:blue", label="GPUs in use")
        gpus_axes.step(xs, [p["quota"] for p in timeline], where="post", color="tab:red",
                       linestyle="--", label="quota")
        gpus_axes.set_ylabel("GPUs")
        top = max([p["quota"] for p in timeline] + [p["gpus_in_use"] for p in timeline] + [1])
        gpus_axes.set_ylim(0, top * 1.3)  # room above the quota's line for the legend
        gpus_axes.legend(loc="upper right")
        gpus_axes.set_title(title or "Replay: GPUs in use against the quota")

        depth_axes.step(xs, [p["queue_depth"] for p in timeline], where="post",
                        color="tab:orange", label="queue depth")
        depth_axes.set_ylabel("jobs waiting")
        depth_axes.set_xlabel(f"virtual time ({unit} from the trace's start)")
        depth_axes.set_ylim(bottom=0)
        depth_axes.legend(loc="upper right")
        depth_axes.sharex(gpus_axes)

        names = sorted(waits)
        series = [[w / 3600 for w in waits[name]] or [math.nan] for name in names]
        if names:
            waits_axes.boxplot(series, tick_labels=[f"{n} ({len(waits[n])})" for n in names],
                               whis=(5, 95), flierprops={"markersize": 2})
            if len(names) > 12:
                waits_axes.tick_params(axis="x", labelrotation=90)
        else:
            waits_axes.text(0.5, 0.5, "no waits recorded", ha="center", va="center",
                            transform=waits_axes.transAxes)
        waits_axes.set_ylabel("wait (hours)")
        waits_axes.set_title("wait distribution per user (jobs admitted)")
        waits_axes.set_ylim(bottom=0)
        figure.savefig(path, format=path.suffix.lstrip(".").lower() or "svg",
                       metadata=_metadata(path))


def _metadata(path: Path) -> dict[str, Any] | None:
    # No creation date in the file: the same replay draws the same bytes.
    if path.suffix.lower() in ("", ".svg"):
        return {"Date": None}
    if path.suffix.lower() == ".pdf":
        return {"CreationDate": None}
    return None


def _timeline(result: Mapping[str, Any]) -> list[Mapping[str, float]]:
    timeline = result.get("timeline")
    if not isinstance(timeline, Sequence) or isinstance(timeline, str):
        raise ValueError("the replay's result has no timeline (a list of "
                         "{t, queue_depth, gpus_in_use, quota}) to plot")
    for index, point in enumerate(timeline):
        if not isinstance(point, Mapping) or any(
                not isinstance(point.get(key), (int, float)) for key in TIMELINE_KEYS):
            raise ValueError(f"timeline point {index} is {point!r}; each point needs numbers "
                             f"for {', '.join(TIMELINE_KEYS)}")
    return list(timeline)


def _waits(result: Mapping[str, Any]) -> dict[str, list[float]]:
    users = result.get("users", {})
    if not isinstance(users, Mapping):
        raise ValueError("the replay's result's users is not a mapping of name to figures")
    out: dict[str, list[float]] = {}
    for name, figures in users.items():
        waits = figures.get("waits") if isinstance(figures, Mapping) else None
        if not isinstance(waits, Sequence) or not all(
                isinstance(w, (int, float)) for w in waits):
            raise ValueError(f"user {name!r} has no list of waits (seconds) to plot")
        out[str(name)] = [float(w) for w in waits]
    return out
