"""gunicorn config for the profile run (bench/sec_profile.py).

The worker's profiler starts when it serves `GET /health?bench-profile=start`, sent after a
warm-up, so imports, pool connection and first-call costs stay out of the figures; it dumps
its stats to $SFTQ_BENCH_PROFILE_OUT.<pid> when the worker exits.
"""

from __future__ import annotations

import cProfile
import os
from typing import Any

START_QUERY = "bench-profile=start"
_profiles: dict[int, cProfile.Profile] = {}


def pre_request(worker: Any, req: Any) -> None:
    if req.query == START_QUERY and os.getpid() not in _profiles:
        prof = cProfile.Profile()
        _profiles[os.getpid()] = prof
        prof.enable()


def worker_exit(server: Any, worker: Any) -> None:
    prof = _profiles.pop(os.getpid(), None)
    if prof is None:
        return
    prof.disable()
    prof.dump_stats(f"{os.environ['SFTQ_BENCH_PROFILE_OUT']}.{os.getpid()}")
