"""The simulator's state file: the account as it stands (jobs and their clocks, quota, resources,
request rate, faults), so that a restarted simulator picks up where it was.

One JSON document, rewritten whole after each change (a create, a cancel, a `/_sim` setting)
and never on a read: a dev account holds tens of jobs, so a whole rewrite is a few kilobytes,
and writing it to a temporary file then `os.replace` means a reader (the next start) sees the
old state or the new one, never half of each, even after a kill -9. Times are kept as wall-clock
seconds (the process's monotonic clock restarts with it), so a job whose run time passed while
the simulator was down has finished when it comes back.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

VERSION = 1


class StateFileError(Exception):
    """The state file exists but cannot be read back; the message says which and why."""


def read_state(path: Path) -> dict[str, Any] | None:
    """The saved state, or None when there is no file yet."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateFileError(f"cannot read the simulator's state file {path}: {exc}") from exc
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise StateFileError(
            f"the simulator's state file {path} is not valid JSON ({exc}); remove it to start "
            "with an empty account"
        ) from exc
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise StateFileError(
            f"the simulator's state file {path} is not a version {VERSION} state; remove it to "
            "start with an empty account"
        )
    return data


def write_state(path: Path, data: dict[str, Any]) -> None:
    """Replace the file with `data` atomically (a temporary file in the same folder, fsynced,
    then renamed over it); mode 0600, like the rest of the dev stack's data folder."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"version": VERSION, **data}, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
