"""An in-memory Fireworks control plane, served over real HTTP.

It speaks the subset of the Fireworks API the scheduler uses (fine-tuning jobs of the three
kinds, and the training GPU quota) with Fireworks' paths, shapes, validation and error bodies,
so the same provider client talks to it and to Fireworks with only the base URL changed.
A small control surface under `/_sim/...` lets tests and demos move quota, finish jobs,
inject faults, script exact answers and read back every request received. See
docs/simulator.md.

One module per concept:
- `state`: the account (jobs, their lifecycle, the quota) and the Python control helpers;
- `app`: the HTTP surface (Fireworks paths and `/_sim`), `Simulator`;
- `validation`: what Fireworks refuses at create time and the error bodies;
- `rules`: injected faults and scripted answers;
- `store`: the state file that keeps the account across restarts (optional);
- `server`: `SimulatorServer` for tests, `serve` and `main` for a process.
"""

from __future__ import annotations

from sftq_server.simulator.app import Simulator
from sftq_server.simulator.rules import (
    DEFAULT_FAULT_STATUSES,
    DEFAULT_TIMEOUT_SECONDS,
    Faults,
    Rule,
)
from sftq_server.simulator.server import SimulatorServer, main, serve
from sftq_server.simulator.state import (
    CANCELLED,
    COLLECTIONS,
    COMPLETED,
    FINISH_STATES,
    LIFECYCLE,
    TERMINAL_STATES,
)
from sftq_server.simulator.store import StateFileError
from sftq_server.simulator.validation import DEFAULT_GPUS, error_body, job_gpus, validate_payload

__all__ = [
    "CANCELLED",
    "COLLECTIONS",
    "COMPLETED",
    "DEFAULT_FAULT_STATUSES",
    "DEFAULT_GPUS",
    "DEFAULT_TIMEOUT_SECONDS",
    "FINISH_STATES",
    "LIFECYCLE",
    "TERMINAL_STATES",
    "Faults",
    "Rule",
    "Simulator",
    "SimulatorServer",
    "StateFileError",
    "error_body",
    "job_gpus",
    "main",
    "serve",
    "validate_payload",
]
