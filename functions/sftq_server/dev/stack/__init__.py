"""`sftq dev`: the whole system on one machine, started, watched and stopped as one.

The supervisor (supervisor.py) owns every part it starts: the database (database.py: the one in
DATABASE_URL, else an embedded PostgreSQL through LocalCluster) and the child processes
(children.py), each in its own process group:

    simulator  python -m sftq_server.simulator          (unless --provider fireworks)
    gateway    python -m sftq_server.cli.dev serve      (the three functions behind one port)
    webhooks   python -m sftq_server.cli.dev deliver    (webhook deliveries, always)
    ticker     python -m sftq_server.cli.dev ticker     (unless --tick-interval 0)

Whatever was started is stopped on every way out: a signal, a child that dies, a failed
start. Children also get SIGTERM from the kernel if the supervisor itself is killed -9.

State kept in the data dir, so a restart looks the same from outside: the PostgreSQL
cluster and the port it listens on (pg.port), and the env file (sftq_server.dev.envfile), whose
SFTQ_TICK_SECRET and SFTQ_API_KEY are reused (the key cannot be recovered from the database,
which keeps only its hash). stdout carries only the KEY=value lines and `ready`; progress goes
to stderr.

To add a process to the stack: one entry in children.stack_children. To print another
KEY=value line: one entry in devenv.ENV_LINES.
"""

from __future__ import annotations

from sftq_server.dev.stack.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, DevConfig, StartupError
from sftq_server.dev.stack.supervisor import DEMO_USER, DevStack

__all__ = [
    "DEMO_USER",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "DevConfig",
    "DevStack",
    "StartupError",
]
