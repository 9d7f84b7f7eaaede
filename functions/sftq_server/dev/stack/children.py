"""The dev stack's child processes: what runs (stack_children, the one table), and how a child
is started and stopped.

Each child runs this interpreter (no reliance on PATH) in its own process group, so a Ctrl-C
in the terminal reaches only the supervisor, which then stops the children in order. On Linux
each child also asks the kernel for SIGTERM when the supervisor dies, even by kill -9.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sftq_server.dev.envfile import StackFacts
from sftq_server.dev.stack.common import DevConfig

# The simulator accepts any bearer key; the provider client still wants one to send.
SIMULATOR_API_KEY = "sim-placeholder-key"
SIMULATOR_ACCOUNT = "sim-account"
# The simulator's state, in the data dir next to the database.
SIMULATOR_STATE_FILE = "simulator.json"


@dataclass(frozen=True)
class ChildSpec:
    """One process of the stack.

    ready_url: the stack is `ready` only once this answers 2xx (None: no check).
    after_ready: started only once the rest answers (the ticker: its first tick should land).
    """

    name: str
    argv: list[str]
    env: Mapping[str, str]
    ready_url: str | None = None
    after_ready: bool = False


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    argv: list[str] = field(default_factory=list)


def server_command(*args: str) -> list[str]:
    """argv running a server subcommand with this interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "sftq_server.cli.dev", *args]


def stack_children(config: DevConfig, facts: StackFacts, data_dir: str) -> list[ChildSpec]:
    """Every child of `sftq dev`, in start order: adding a process to the stack is one entry."""
    base_env = dict(os.environ) | {"PYTHONUNBUFFERED": "1"}
    gateway_env = base_env | {
        "DATABASE_URL": facts.database_url,
        "SFTQ_TICK_SECRET": facts.tick_secret,
        # A local stack: scheduler-tick skips the production rule on the secret's length.
        "SFTQ_DEV_STACK": "1",
        # Local webhook receivers (sftq webhooks listen) live on loopback.
        "SFTQ_WEBHOOKS_ALLOW_PRIVATE": os.environ.get("SFTQ_WEBHOOKS_ALLOW_PRIVATE", "true"),
    }
    gateway_env |= {"SFTQ_TICK_INTERVAL_SECONDS": f"{config.tick_interval:g}"} if config.tick_interval > 0 else {}  # noqa: E501
    specs: list[ChildSpec] = []
    if config.provider == "simulator":
        specs.append(
            ChildSpec(
                "simulator",
                [
                    sys.executable,
                    "-m",
                    "sftq_server.simulator",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(config.simulator_port),
                    "--job-seconds",
                    f"{config.simulator_job_seconds:g}",
                    "--account-id",
                    SIMULATOR_ACCOUNT,
                    # The simulated account outlives a restart, as the database does: the
                    # queue's running jobs are still running at "Fireworks" afterwards.
                    "--state-file",
                    str(Path(data_dir) / SIMULATOR_STATE_FILE),
                ],
                base_env,
                ready_url=f"{facts.simulator_url}/_sim/health",
            )
        )
        gateway_env |= {
            "FIREWORKS_BASE_URL": facts.simulator_url,
            "FIREWORKS_API_KEY": SIMULATOR_API_KEY,
            "FIREWORKS_ACCOUNT_ID": SIMULATOR_ACCOUNT,
        }
    specs.append(
        ChildSpec(
            "gateway",
            server_command(
                "serve",
                "--host",
                config.host,
                "--port",
                str(config.port),
                *(["--verbose"] if config.verbose else []),
            ),
            gateway_env,
            ready_url=f"{facts.local_base}/functions/v1/jobs-api/health",
        )
    )
    # Webhooks are delivered whatever --tick-interval says (docs/webhooks.md).
    specs.append(ChildSpec("webhooks", server_command("deliver"), gateway_env))
    if config.tick_interval > 0:
        specs.append(
            ChildSpec(
                "ticker",
                server_command(
                    "ticker",
                    "--interval",
                    f"{config.tick_interval:g}",
                    "--url",
                    f"{facts.local_base}/functions/v1/scheduler-tick",
                    "--data-dir",
                    data_dir,
                    # The gateway logs each tick; the ticker adds only ticks that did not run.
                    *(["--verbose"] if config.verbose else ["--quiet"]),
                ),
                base_env | {"SFTQ_TICK_SECRET": facts.tick_secret},
                after_ready=True,
            )
        )
    return specs


# -- process groups ----------------------------------------------------------------------
def _death_signal_hook() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGTERM the child when the supervisor dies (even by -9).

    libc is looked up here, in the parent: between fork and exec the child only calls it.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM))

    return hook


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def spawn(spec: ChildSpec, out: int) -> Child:
    """Start one child writing to `out` (the supervisor's stderr: stdout stays machine-readable)."""
    proc = subprocess.Popen(
        spec.argv,
        stdin=subprocess.DEVNULL,
        stdout=out,
        env=dict(spec.env),
        start_new_session=True,
        preexec_fn=_death_signal_hook(),
    )
    return Child(spec.name, proc, spec.argv)


def dead_child(children: list[Child]) -> Child | None:
    for child in children:
        if child.proc.poll() is not None:
            return child
    return None


def stop_children(children: list[Child], timeout: float, log: Callable[[str], None]) -> None:
    """SIGTERM every child's group at once, newest first; SIGKILL what is left at the deadline.

    Newest first: the ticker stops calling the gateway, the gateway stops calling the simulator.
    All share one deadline, so stopping is quick.
    """
    ordered = list(reversed(children))
    for child in ordered:
        if child.proc.poll() is None:
            _signal_group(child.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in ordered:
        try:
            child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log(f"the {child.name} did not stop in {timeout:g}s; killing it")
            _signal_group(child.proc.pid, signal.SIGKILL)
            child.proc.wait()
        # The leader is gone; anything it left in its group goes too.
        if _group_alive(child.proc.pid):
            _signal_group(child.proc.pid, signal.SIGKILL)
    if ordered:
        log("stopped " + ", ".join(c.name for c in ordered))
