"""Cold start and memory of the function processes.

Cold import: a fresh interpreter per measurement (median of 7), from its start to the moment
it has run the code (not to its exit), minus the same for a bare interpreter, for each
functions/ entry module: importing it (what the host does at boot), and
importing it plus building its handler (what the first request adds: sftq_server, pydantic
models, psycopg and its pool; no connection is opened). `-X importtime` names the largest
imports. Our modules are compiled to bytecode first, as the Dockerfile's image ships them
(the third-party ones were compiled when installed). Peak RSS: VmHWM of the server's worker
processes after the HTTP enqueue load.
"""

from __future__ import annotations

import compileall
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import loadgen
import servers
from common import FUNCTIONS, Bench

SECTION = "footprint"

# Entry module -> what its first request imports beyond building the handler (the tick app
# loads the scheduler, the database module and the provider client only when a tick runs).
ENTRIES = {
    "jobs_api": "",
    "analytics_api": "",
    "scheduler_tick": "import sftq_server.scheduler.tick",
}

# Build what the entry builds on its first request, whatever it calls its lazy holder: an
# object with a get() (sftq_server.core.lazy.Lazy) or a _get_*() function.
FIRST_REQUEST = """
import {module} as m
built = 0
for name, value in list(vars(m).items()):
    if type(value).__name__ == "Lazy":
        value.get(); built += 1
    elif name.startswith("_get_") and callable(value):
        value(); built += 1
assert built, "no lazy handler found in {module}"
{extra}
"""


FLOOR = "import psycopg, psycopg_pool, pydantic\nfrom pydantic import BaseModel"


def _largest(top: list[tuple[float, str]]) -> str:
    """The three largest imports of an `_importtime` answer, as a note."""
    return ", ".join(f"{name} {ms:.0f}" for ms, name in top[:3])


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SFTQ_", "DATABASE_URL", "FIREWORKS_", "PYTHON"))}
    env.update({"PYTHONPATH": str(FUNCTIONS), "PYTHONDONTWRITEBYTECODE": "1",
                # Never connected to: the handler opens its pool on the first request.
                "DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none",
                "SFTQ_TICK_SECRET": "bench-secret-bench-secret-bench-secret",
                "FIREWORKS_API_KEY": "bench", "FIREWORKS_ACCOUNT_ID": "bench"})
    return env


def _run_ms(src: str, env: dict[str, str]) -> float:
    """Time (ms) from starting a fresh interpreter to the moment it has run `src`: the child
    writes one byte when done, and the clock stops when it arrives, so the interpreter's exit
    (joining threads some libraries leave behind, which wait in 50 ms steps) is not counted.
    Bounded by a timer that kills a child that hangs."""
    code = src + "\nimport os\nos.write(1, b'.')\n"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    killer = threading.Timer(60, proc.kill)
    killer.start()
    try:
        assert proc.stdout is not None
        done = proc.stdout.read(1)
        elapsed = (time.perf_counter() - t0) * 1000
        proc.stdout.read()
        returncode = proc.wait()
    finally:
        killer.cancel()
    if returncode or done != b".":
        raise subprocess.CalledProcessError(returncode, [sys.executable, "-c", src])
    return elapsed


def _wall(code: str, reps: int) -> float:
    """Median wall time (ms) of a fresh interpreter running `code`, minus that of one running
    nothing, measured back to back each time so drift in the machine's load cancels out."""
    env = _env()
    diffs = []
    for _ in range(reps):
        pair = []
        for src in ("pass", code):
            pair.append(_run_ms(src, env))
        diffs.append(pair[1] - pair[0])
    return max(0.0, statistics.median(diffs))


def _interpreter(reps: int) -> float:
    env = _env()
    times = []
    for _ in range(reps):
        times.append(_run_ms("pass", env))
    return statistics.median(times)


def _importtime(code: str) -> list[tuple[float, str]]:
    """The largest top-level imports (cumulative ms) of a fresh interpreter running `code`."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=_env(),
                          capture_output=True, text=True, check=True, timeout=60)
    roots: list[tuple[float, str]] = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue  # the header line
        name = parts[2]
        # One space after the bar marks an import made by the code itself, not a nested one.
        if len(name) - len(name.lstrip(" ")) == 1:
            roots.append((int(parts[1]) / 1000, name.strip()))
    return sorted(roots, reverse=True)[:8]


def run(b: Bench) -> None:
    reps = 3 if b.quick else 7
    # A fresh checkout has no bytecode, and the children may not write any: without this they
    # would time compiling our sources, which a deployed image does not do.
    compileall.compile_dir(FUNCTIONS, quiet=1)
    results: dict[str, Any] = {}
    b.data[SECTION] = results
    results["interpreter_ms"] = _interpreter(reps)
    for module, extra in ENTRIES.items():
        code = FIRST_REQUEST.format(module=module, extra=extra)
        imp = _wall(f"import {module}", reps)
        first = _wall(code, reps)
        top = _importtime(code)
        results[module] = {"import_ms": imp, "first_request_ms": first, "top_imports": top}
        b.add(SECTION, f"cold import {module}", imp, "ms", goal="< 300", ok=imp < 300,
              note=f"+ handler built (first request): {first:.0f} ms")
        b.add(SECTION, f"cold import + handler, {module}", first, "ms", goal="< 300",
              ok=first < 300, note="largest: " + _largest(top))
    # What no entry can start without: the database driver and its pool, and pydantic (the
    # submit body's validation). An entry's row minus this one is the part that is ours.
    floor = _wall(FLOOR, reps)
    results["floor_ms"] = floor
    b.add(SECTION, "cold import psycopg + psycopg_pool + pydantic (the floor)", floor, "ms",
          note="third-party imports every entry needs before a line of ours: "
               + _largest(_importtime(FLOOR)))
    ff = _wall("import functions_framework", reps)
    results["functions_framework_ms"] = ff
    b.add(SECTION, "cold import functions_framework (the host itself)", ff, "ms",
          note="paid by every functions-framework deployment before our module")

    enq = b.data.get("enqueue", {}).get("http", {})
    for name, res in enq.items():
        if "peak_rss_kib" in res and ("no access log" not in name and "synchronous" not in name):
            b.add(SECTION, f"peak RSS of a worker under load, {name}",
                  res["peak_rss_kib"] / 1024, "MiB")
    if not enq:
        _own_rss(b, results)


def _own_rss(b: Bench, results: dict[str, Any]) -> None:
    """No enqueue section in this run: a short load of our own for the worker's peak RSS."""
    from sec_enqueue import BODY, fresh_db, recommended_spec

    spec = recommended_spec()
    if spec is None:
        return
    dbname = "bench_http"
    url, _, keys = fresh_db(b, dbname)
    server = servers.start(spec, url, b.out_dir / "logs")
    try:
        n = 500 if b.quick else 3000
        if loadgen.have_wrk():
            loadgen.wrk_load(f"http://127.0.0.1:{server.port}", spec.path, keys, BODY,
                             requests=n)
        else:
            loadgen.python_load("127.0.0.1", server.port, spec.path, keys, BODY, requests=n)
        rss = server.peak_rss_kib()
    finally:
        server.stop()
        b.drop_db(dbname)
    results["peak_rss_kib"] = rss
    b.add(SECTION, f"peak RSS of a worker under load, {spec.name}", rss / 1024, "MiB")
