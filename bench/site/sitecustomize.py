"""Put on PYTHONPATH of every server the benchmark starts (gunicorn, granian and
functions-framework alike), so all of them log the same way: with SFTQ_BENCH_ACCESS_LOG=1 the
sftq.access log writes one JSON line per request to stderr, as a deployment that keeps request
logs would; otherwise logging stays at Python's default (warnings only)."""

from __future__ import annotations

import logging
import os
import sys

if os.environ.get("SFTQ_BENCH_ACCESS_LOG") == "1":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
