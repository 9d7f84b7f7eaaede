"""docs/cli.md: every block marked `runnable`, run verbatim in one shell against a live
`sftq dev`, from the root of the checkout (where examples/ is), as the page says."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from conftest import ROOT, DevStacks, clean_env

DOC = ROOT / "docs" / "cli.md"
BLOCK = re.compile(r"^```bash runnable\n(.*?)^```$", re.S | re.M)


def runnable_blocks() -> list[str]:
    blocks = BLOCK.findall(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 8, "docs/cli.md lost its runnable blocks"
    return blocks


def sftq_on_path(tmp_path: Path) -> str:
    """A `sftq` command for the shell: this interpreter's, whatever is installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "sftq"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sftq_client "$@"\n')
    shim.chmod(0o755)
    return str(bin_dir)


def test_the_runnable_blocks_of_cli_md_work_verbatim(stacks: DevStacks, tmp_path: Path) -> None:
    # A ticker, and simulated jobs short enough for `submit --wait` to see one through, long
    # enough that the first job is still running when the page cancels it.
    dev = stacks.start(tick_interval=1, job_seconds=15)
    values = dev.wait_ready()
    env = clean_env(SUPABASE_URL=values["SUPABASE_URL"], SFTQ_API_KEY=values["SFTQ_API_KEY"])
    env["PATH"] = f"{sftq_on_path(tmp_path)}:{env.get('PATH', '/usr/bin:/bin')}"

    script = "set -euo pipefail\n" + "\n".join(runnable_blocks())
    run = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}\n{dev.log()}"
    out = run.stdout
    job = re.search(r"^queued ([0-9a-f-]{36})$", out, re.M)
    assert job, out
    job_id = job.group(1)
    # get by the short id found the job; cancel by it cancelled it; wait saw it cancelled.
    assert f"id:                  {job_id}" in out, out
    assert f"cancelled {job_id}" in out and "exit 11" in out, out
    # submit --wait saw the DPO job through; the RFT job shows in the queue and its analytics.
    assert re.search(r"^kind:\s+DPO$", out, re.M) and re.search(r"^state:\s+SUCCESS$", out, re.M)
    assert re.search(r"^running: ", out, re.M) and re.search(r"^everyone: ", out, re.M), out
    assert "success rate" in out and "cancelled" in out.splitlines()[-1]
    # The table fits 100 columns.
    assert all(len(line) <= 100 for line in out.splitlines() if "my first job" in line), out
    # The first job was running when it was cancelled: "cancelled ID" is that case too (200).
    first = httpx.get(
        f"{values['SUPABASE_URL']}/functions/v1/jobs-api/jobs/{job_id}",
        headers={"Authorization": f"Bearer {values['SFTQ_API_KEY']}"},
    ).json()
    assert first["state"] == "CANCELLED" and first["started_at"] is not None, first

    dev.send(signal.SIGTERM)
    assert dev.wait() == 0, dev.log()
