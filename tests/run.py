"""The test command: `python tests/run.py [pytest args]` (what `make test` and CI run).

Runs pytest with a temporary folder under /tmp (a private PostgreSQL cluster lives
there; as root it is handed to the postgres user) and treats "no tests ran" as failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    basetemp = tempfile.mkdtemp(prefix="sftq-pytest-", dir="/tmp")
    cmd = [sys.executable, "-m", "pytest", f"--basetemp={basetemp}", *sys.argv[1:]]
    # Both source folders first, ahead of the editable install's finder: a git worktree that
    # shares the checkout's .venv then tests its own code, not the checkout's.
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "functions"),
                                                       str(ROOT / "clients")])}
    code = subprocess.call(cmd, cwd=ROOT, env=env)
    if code == 5:
        print("error: no tests were collected", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
