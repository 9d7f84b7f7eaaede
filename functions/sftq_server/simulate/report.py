"""The replay's report as text: one table per settings, or two side by side (--compare)."""

from __future__ import annotations

from typing import Any


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def settings_line(result: dict[str, Any]) -> str:
    s = result["settings"]
    caps = "".join(f", {u}={n}" for u, n in sorted(s.get("caps", {}).items()))
    limits = s.get("limits") or {}
    extra = f", max queued {limits['max_queued']}" if limits.get("max_queued") else ""
    return (f"cap {s['cap']}{caps}, quota {s['quota']} GPUs, tick every "
            f"{s['tick_interval']:g} s, event admission {'on' if s['event_admission'] else 'off'}"
            f"{extra}")


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    blocked = result["blocked"]
    by_user = ", ".join(f"{u} {_duration(s)}" for u, s in sorted(
        blocked["by_user"].items(), key=lambda kv: -kv[1])[:5]) or "nobody"
    return [
        ("Jain's fairness (mean slowdowns)", _num(result["jain_fairness"], 3)),
        ("GPU utilisation (of the quota)", f"{100 * result['gpu_utilisation']:.1f}%"),
        ("idle GPU-hours, head did not fit", _num(result["idle_gpu_hours_head_blocked"], 1)),
        ("queue blocked by its head", _duration(blocked["seconds"])),
        ("  by", by_user),
        (f"jobs waiting over {result['settings']['wait_threshold']:g} s",
         str(result["jobs_over_wait_threshold"])),
        ("replayed", f"{_duration(result['virtual_seconds'])} in {result['wall_seconds']:.1f} s "
                     f"({_num(result['speedup'], 0)}x real time, {result['ticks']} passes)"),
    ]


def table(result: dict[str, Any]) -> str:
    """One replay's report."""
    lines = [f"settings: {settings_line(result)}", ""]
    head = f"{'user':<16} {'jobs':>5} {'wait p50':>10} {'p95':>10} {'max':>10} {'slowdown':>9}"
    lines.append(head)
    lines.append("-" * len(head))
    for name, u in result["users"].items():
        lines.append(f"{name[:16]:<16} {u['jobs']:>5} {_duration(u['wait_p50']):>10} "
                     f"{_duration(u['wait_p95']):>10} {_duration(u['wait_max']):>10} "
                     f"{_num(u['mean_slowdown'], 2):>9}")
    lines.append("")
    lines += [f"{k:<36} {v}" for k, v in summary_rows(result)]
    lines += violations(result)
    return "\n".join(lines)


def violations(result: dict[str, Any]) -> list[str]:
    out = []
    for v in result.get("violations") or []:
        out.append(f"VIOLATION at tick {v['tick']} (virtual {v['at']:g} s): {v['what']}")
        if v.get("jobs"):
            out.append("  jobs: " + ", ".join(v["jobs"]))
    return out


def side_by_side(results: list[dict[str, Any]]) -> str:
    """Two (or more) replays of one trace, column by column."""
    width = 24
    names = [f"[{chr(65 + i)}]" for i in range(len(results))]
    lines = [f"{n} {settings_line(r)}" for n, r in zip(names, results, strict=True)]
    lines.append("")
    head = f"{'user':<16} " + " ".join(f"{n + ' p50 / p95 wait':>{width}}" for n in names)
    lines.append(head)
    lines.append("-" * len(head))
    users = sorted({u for r in results for u in r["users"]})
    for name in users:
        cells = []
        for r in results:
            u = r["users"].get(name)
            cells.append(f"{_duration(u['wait_p50'])} / {_duration(u['wait_p95'])}"
                         if u else "-")
        lines.append(f"{name[:16]:<16} " + " ".join(f"{c:>{width}}" for c in cells))
    lines.append("")
    rows = [summary_rows(r) for r in results]
    for i, (label, _) in enumerate(rows[0]):
        lines.append(f"{label:<36} " + " | ".join(r[i][1] for r in rows))
    for n, r in zip(names, results, strict=True):
        lines += [f"{n} {line}" for line in violations(r)]
    return "\n".join(lines)
