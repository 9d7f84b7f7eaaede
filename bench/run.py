"""The benchmark: `make bench` (or `.venv/bin/python bench/run.py`).

Starts a private PostgreSQL on loopback, runs the sections, prints one table and writes the
figures to bench/results/ as JSON. Figures to compare are ratios from the same run.

    bench/run.py                         everything (9-16 min on 2 cores)
    bench/run.py --only admission,tick   some sections
    bench/run.py --quick                 a fast smoke run (small sizes; what CI runs)
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen  # noqa: E402
from common import (  # noqa: E402
    BENCH,
    Bench,
    background_cores,
    db_probe,
    machine_info,
    speed_probe,
    steal_mark,
    steal_share,
    write_json,
)

# Sections whose HTTP figures need wrk to be comparable with the direct (in-process) ones.
HTTP_SECTIONS = ("enqueue", "footprint", "profile")
NOT_COMPARABLE = ("HTTP ratios are not comparable in this run: wrk is not installed (or "
                  "SFTQ_BENCH_LOADGEN=python), so the Python load generator took CPU from the "
                  "server it measured. Install wrk (apt-get install wrk; `make bench` does it "
                  "as root) and run again.")

# Above this much CPU used by other processes, the run says its figures are disturbed.
QUIET_CORES = 0.25
# Above this share of the CPU taken by the hypervisor (steal time) during a section, the run
# says that section's figures are disturbed.
STEAL_NOTE = 0.02
# Above this spread of the speed probe or of the database probe (slowest over fastest), the
# run says the machine's own speed changed under it.
PROBE_SPREAD_NOTE = 1.25
# What each probe times, as its note says it.
CPU_PROBE = "a fixed CPU loop"
DB_PROBE = "a fixed hash aggregation in PostgreSQL (the database probe)"

SECTIONS = ("enqueue", "enqueue_cost", "admission", "analytics", "tick", "footprint", "profile",
            "stream", "webhooks",
            "visibility", "mcp", "preflight", "metrics", "admission_latency", "replay")


def _module(name: str) -> Any:
    return __import__(f"sec_{name}")


def print_table(b: Bench) -> str:
    lines = []
    header = f"{'section':<10} {'figure':<58} {'value':>12} {'unit':<7} {'goal':<8} {'':<6} note"
    lines.append(header)
    lines.append("-" * len(header))
    for r in b.rows:
        if r.value is None:
            shown = "-"
        elif abs(r.value) >= 100:
            shown = f"{r.value:,.0f}"
        elif abs(r.value) >= 10:
            shown = f"{r.value:.1f}"
        else:
            shown = f"{r.value:.3f}" if abs(r.value) < 1 else f"{r.value:.2f}"
        verdict = "" if r.ok is None else ("ok" if r.ok else "MISSED")
        flag = verdict if r.comparable else "n/c"
        lines.append(f"{r.section:<10} {r.name[:58]:<58} {shown:>12} {r.unit:<7} {r.goal:<8} "
                     f"{flag:<6} {r.note}")
    return "\n".join(lines)


def mark_not_comparable(b: Bench) -> None:
    """Without wrk, every HTTP row with a goal is printed as n/c instead of ok or MISSED."""
    for r in b.rows:
        # "same, by CPU per job" rows restate the HTTP ratio above them.
        http = "HTTP" in r.name or r.name.startswith("same, by CPU")
        if r.section in HTTP_SECTIONS and r.ok is not None and http:
            r.comparable = False
    if NOT_COMPARABLE not in b.notes:
        b.notes.insert(0, NOT_COMPARABLE)


def probe_note(probes: dict[str, float], what: str = CPU_PROBE) -> str | None:
    """What the run says when a probe taken before each section (and after the last) varied
    more than PROBE_SPREAD_NOTE, or None. `what` says what the probe times."""
    if len(probes) < 2:
        return None
    fastest, slowest = min(probes.values()), max(probes.values())
    if slowest <= fastest * PROBE_SPREAD_NOTE:
        return None
    slow = ", ".join(k for k, v in probes.items() if v > fastest * PROBE_SPREAD_NOTE)
    return (f"the machine's speed changed during the run: {what} took "
            f"{fastest:.0f}-{slowest:.0f} ms ({slowest / fastest:.1f}x; slow before: {slow}), "
            "more than steal time shows: absolute figures of the slow sections are low, "
            "compare ratios within a section only, or run again")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections from: {', '.join(SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to this long for other processes to go quiet")
    parser.add_argument("--out", type=Path, default=BENCH / "results",
                        help="folder for the JSON results and server logs")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s): {', '.join(unknown)}")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    b = Bench(quick=args.quick, out_dir=args.out / stamp)
    b.out_dir.mkdir(parents=True, exist_ok=True)

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    started = time.monotonic()
    failed: list[str] = []
    section_seconds: dict[str, float] = {}
    section_steal: dict[str, float] = {}
    # The speed probe's and the database probe's milliseconds before each section, and "end"
    # after the last.
    probes: dict[str, float] = {}
    db_probes: dict[str, float] = {}

    def take_probes(at: str) -> None:
        probes[at] = round(speed_probe(), 1)
        db_probes[at] = round(db_probe(b.url("postgres")), 1)

    try:
        busy = background_cores()
        deadline = time.monotonic() + args.wait_quiet
        while busy > QUIET_CORES and time.monotonic() < deadline:
            print(f"other processes keep {busy:.2f} cores busy; waiting for quiet ...", flush=True)
            time.sleep(10)
            busy = background_cores()
        b.data["background_cores_at_start"] = round(busy, 2)
        if busy > QUIET_CORES:
            b.notes.append(f"other processes kept {busy:.2f} of the machine's cores busy when "
                           "the run started: absolute figures are low, ratios less affected")
        if not loadgen.have_wrk() and any(s in chosen for s in HTTP_SECTIONS):
            print(f"note: {NOT_COMPARABLE}", flush=True)
        print("starting a private PostgreSQL on loopback ...", flush=True)
        b.start_cluster()
        b.data["machine"] = machine_info() | {"postgres": b.server_version()}
        b.data["pg_settings"] = __import__("common").PG_SETTINGS
        m = b.data["machine"]
        print(f"machine: {m['nproc']} CPUs, {m['mem_gib']} GiB, PostgreSQL {m['postgres']}, "
              f"Python {m['python']}", flush=True)
        for name in SECTIONS:
            if name not in chosen:
                continue
            print(f"\n== {name} ==", flush=True)
            take_probes(name)
            t0 = time.monotonic()
            steal0 = steal_mark()
            try:
                _module(name).run(b)
            except KeyboardInterrupt:
                raise
            except Exception:
                failed.append(name)
                traceback.print_exc()
            section_seconds[name] = round(time.monotonic() - t0, 1)
            # Steal time: the hypervisor ran other guests on this machine's CPUs. The
            # other-process shares the sections measure do not see it.
            share = steal_share(steal0)
            section_steal[name] = round(share, 3)
            print(f"   ({section_seconds[name]} s; steal {share:.1%} of the CPU; before it the "
                  f"speed probe {probes[name]} ms, the database probe {db_probes[name]} ms)",
                  flush=True)
            if share > STEAL_NOTE:
                b.notes.append(f"the hypervisor took {share:.1%} of the machine's CPU during the "
                               f"{name} section (steal time): its figures are disturbed; run "
                               "it again")
        take_probes("end")
        for note in (probe_note(probes, CPU_PROBE), probe_note(db_probes, DB_PROBE)):
            if note:
                b.notes.append(note)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        failed.append("interrupted")
    finally:
        b.stop_cluster()

    total = time.monotonic() - started
    if not loadgen.have_wrk():
        mark_not_comparable(b)
    table = print_table(b)
    print("\n" + table)
    for note in b.notes:
        print(f"note: {note}")
    print(f"\ntotal {total:.0f} s; sections: "
          + ", ".join(f"{k} {v} s" for k, v in section_seconds.items())
          + "; steal: " + ", ".join(f"{k} {v:.1%}" for k, v in section_steal.items())
          + "; speed probe (ms): " + ", ".join(f"{k} {v}" for k, v in probes.items())
          + "; database probe (ms): " + ", ".join(f"{k} {v}" for k, v in db_probes.items()))
    payload = {"started": stamp, "quick": args.quick, "sections": chosen,
               "section_seconds": section_seconds, "section_steal": section_steal,
               "speed_probe_ms": probes, "db_probe_ms": db_probes,
               "total_seconds": round(total, 1),
               "failed": failed, "notes": b.notes,
               "rows": [r.__dict__ for r in b.rows], "data": b.data}
    out = b.out_dir / "results.json"
    write_json(out, payload)
    write_json(args.out / "latest.json", payload)
    (b.out_dir / "table.txt").write_text(table + "\n")
    print(f"results: {out}")
    if failed:
        print(f"FAILED sections: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
