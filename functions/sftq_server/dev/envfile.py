"""The dev stack's env file (<data-dir>/env) and the KEY=value lines `sftq dev` prints.

ENV_LINES is the one list of those lines, in the order they are printed and written. Each
line's value is computed from StackFacts, what the supervisor knows once the database is up
and the demo key issued; to print a new line, add it to ENV_LINES (and, if it needs a fact the
stack does not know yet, a field to StackFacts). Other commands (`sftq admin`, `sftq tick`, ...)
read the file back with read_env_file, so a shell needs no exported variables.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StackFacts:
    """What the printed lines and the children's settings are computed from."""

    base_url: str  # the functions, as printed (http://<--host>:<--port>)
    local_base: str  # the same, reachable from this machine (a wildcard bind -> loopback)
    database_url: str
    simulator_url: str  # "" with --provider fireworks
    tick_secret: str
    api_key: str


# (name, value): printed in this order, then `ready`; the same lines go to <data-dir>/env.
ENV_LINES: tuple[tuple[str, Callable[[StackFacts], str]], ...] = (
    ("SUPABASE_URL", lambda f: f.base_url),
    ("DATABASE_URL", lambda f: f.database_url),
    ("SIMULATOR_URL", lambda f: f.simulator_url),
    ("SFTQ_TICK_SECRET", lambda f: f.tick_secret),
    ("SFTQ_API_KEY", lambda f: f.api_key),
    ("DASHBOARD_URL", lambda f: f"{f.base_url}/functions/v1/jobs-api/dashboard"),
)
ENV_NAMES = tuple(name for name, _ in ENV_LINES)


def env_values(facts: StackFacts) -> dict[str, str]:
    return {name: value(facts) for name, value in ENV_LINES}


def env_lines(values: dict[str, str]) -> list[str]:
    """The KEY=value lines, shell-quoted only where a value needs it, in the documented order."""
    return [f"{name}={shlex.quote(values[name]) if values[name] else ''}" for name in ENV_NAMES]


def write_env_file(data_dir: Path, lines: list[str]) -> Path:
    """<data-dir>/env, mode 0600 from the first byte (it holds a key and the tick secret)."""
    path = data_dir / "env"
    tmp = data_dir / "env.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("# Written by `sftq dev`; load it into a shell with: source <this file>\n")
        f.write("\n".join(lines) + "\n")
        # Exported, so programs started from that shell (the sftq CLI, scripts) see them too.
        f.write("export " + " ".join(ENV_NAMES) + "\n")
        f.write(path_line())
    os.replace(tmp, path)
    return path


def scripts_dir() -> str:
    """The folder of this interpreter's console scripts (a venv's bin/, where `sftq` is)."""
    return sysconfig.get_path("scripts") or os.path.dirname(sys.executable)


def path_line(folder: str | None = None) -> str:
    """A shell line putting `folder` (the scripts folder) first on PATH, once: a shell that
    sources the env file twice does not grow its PATH. POSIX sh, so `.` works as `source`."""
    quoted = shlex.quote(folder or scripts_dir())
    return (
        "# The `sftq` command of the Python that runs the stack, first on PATH.\n"
        f'case ":$PATH:" in *:{quoted}:*) ;; *) PATH={quoted}:"$PATH"; export PATH ;; esac\n'
    )


def read_env_file(data_dir: str | Path) -> dict[str, str]:
    path = Path(data_dir) / "env"
    if not path.is_file():
        return {}
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export ") :]
        if "=" in line and not line.startswith(("#", "case ")):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip("'\"")
    return values
