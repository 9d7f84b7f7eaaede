"""`make dev` keeps sftq dev's stdout contract: only the KEY=value lines, then `ready`, even on
the first run that makes the venv (issue 54 item 11: make echoed its recipe lines)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

# A stand-in for python3: `-m venv DIR` makes DIR/bin/python (this same script, whose pip
# prints on stdout as pip does) and DIR/bin/sftq, which prints what `sftq dev` prints.
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  echo "creating virtual environment in $3"
  mkdir -p "$3/bin"
  cp "$0" "$3/bin/python"
  { echo '#!/bin/sh'; echo 'echo SUPABASE_URL=http://127.0.0.1:8080; echo ready'
    echo 'echo "sftq dev: progress" >&2'; } > "$3/bin/sftq"
  chmod +x "$3/bin/sftq"
  exit 0
fi
echo "Successfully installed finetune-queue-0.1.0"
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_dev_prints_only_the_stacks_lines(tmp_path: Path) -> None:
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    for run_number in (1, 2):  # the first run makes the venv; the second only starts the stack
        run = subprocess.run(
            ["make", "--no-print-directory", "dev", f"PYTHON={fake}", f"VENV={venv}"],
            cwd=ROOT,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.splitlines() == ["SUPABASE_URL=http://127.0.0.1:8080", "ready"], (
            run_number, run.stdout)
        assert "sftq dev: progress" in run.stderr
    assert (venv / ".installed").is_file()
