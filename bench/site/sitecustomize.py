"""Put on PYTHONPATH of every server the benchmark starts (gunicorn, granian and
functions-framework alike), so all of them log the same way: with SFTQ_BENCH_ACCESS_LOG=1 the
sftq.access log writes one JSON line per request to stderr, set up as the servers we ship set
it up (sftq_server.core.logs.configure); otherwise warnings and errors only, on a plain handler
that the image's own set-up then leaves alone (sftq_server.core.logs.configure defers to it)."""

from __future__ import annotations

import os

if os.environ.get("SFTQ_BENCH_ACCESS_LOG") == "1":
    from sftq_server.core import logs as logs

    logs.configure()
else:
    import logging

    logging.getLogger().addHandler(logging.StreamHandler())
