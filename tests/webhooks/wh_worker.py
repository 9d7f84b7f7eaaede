"""A deliverer in its own process, for the kill tests: `python wh_worker.py MODE DATABASE_URL`.

MODE normal:  the real Deliverer, with a short lease (6.5 s) and timeout (5 s), so a test
              that kills it sees its rows due again quickly.
MODE pause:   claims, prints "claimed <webhook-id>" for each row, and then never sends:
              the window between a committed claim and the send, held open for a SIGKILL.
Settings come from the environment (SFTQ_WEBHOOKS_KEY, SFTQ_WEBHOOKS_ALLOW_PRIVATE).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.webhooks import Answer, Claimed, Deliverer


class PauseAfterClaim(Deliverer):
    claimed_once = False

    def claim(self, limit: int) -> list[Claimed]:
        # One batch only: once its leases run out, the rows belong to the next worker.
        if self.claimed_once:
            return []
        rows = super().claim(limit)
        self.claimed_once = bool(rows)
        return rows

    def attempt(self, row: Claimed) -> Answer:
        os.write(1, f"claimed {row.webhook_id}\n".encode())  # one write: lines never mix
        time.sleep(3600)
        raise AssertionError("unreachable")


def main() -> int:
    mode, url = sys.argv[1], sys.argv[2]
    settings = dataclasses.replace(Settings.from_env(), database_url=url)
    cls = PauseAfterClaim if mode == "pause" else Deliverer
    deliverer = cls(Database(url, max_size=4), settings, concurrency=8, per_endpoint=8,
                    lease_seconds=6.5, timeout=5.0,
                    on_outcome=lambda o: print(o.line(), flush=True))
    print("ready", flush=True)
    deliverer.run(threading.Event(), poll_interval=0.05)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
