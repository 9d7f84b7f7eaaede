"""docs/cli.md and README.md: every block marked `runnable`, run verbatim in one shell against a
live `sftq dev`, as the pages say: in a folder that has examples/, after `source .sftq/env` and
nothing else (no `sftq` on PATH beforehand: the env file puts it there)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import httpx
from conftest import ROOT, DevStacks, clean_env

DOC = ROOT / "docs" / "cli.md"
README = ROOT / "README.md"
BLOCK = re.compile(r"^```bash runnable\n(.*?)^```$", re.S | re.M)


def runnable_blocks(doc: Path = DOC, at_least: int = 8) -> list[str]:
    blocks = BLOCK.findall(doc.read_text(encoding="utf-8"))
    assert len(blocks) >= at_least, f"{doc.name} lost its runnable blocks"
    return blocks


def shell_env() -> dict[str, str]:
    """A shell as a new user has it: no stack settings, and no `sftq` on PATH."""
    env = clean_env()
    folders = env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    env["PATH"] = os.pathsep.join(
        f for f in folders if f and not os.access(os.path.join(f, "sftq"), os.X_OK)
    )
    return env


def run_sourced(work: Path, blocks: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    script = "set -euo pipefail\nsource .sftq/env\n" + "\n".join(blocks)
    return subprocess.run(
        ["bash", "-c", script],
        cwd=work,
        env=shell_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_runnable_blocks_of_cli_md_work_verbatim(stacks: DevStacks, tmp_path: Path) -> None:
    # A ticker, and simulated jobs short enough for `submit --wait` to see one through, long
    # enough that the first job is still running when the page cancels it. A folder like the
    # checkout's root: the stack's data in .sftq, the sample payloads in examples/.
    work = tmp_path / "checkout"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    dev = stacks.start(work / ".sftq", cwd=work, tick_interval=1, job_seconds=15)
    values = dev.wait_ready()

    run = run_sourced(work, runnable_blocks(), timeout=240)
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}\n{dev.log()}"
    assert "Traceback" not in run.stderr, run.stderr
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
    # The table fits 100 columns (`--wide`, which the page also runs, shows whole ids and may not).
    short_rows = [line for line in out.splitlines()
                  if "my first job" in line and job_id not in line]
    assert short_rows and all(len(line) <= 100 for line in short_rows), out
    # The first job was running when it was cancelled: "cancelled ID" is that case too (200).
    first = httpx.get(
        f"{values['SUPABASE_URL']}/functions/v1/jobs-api/jobs/{job_id}",
        headers={"Authorization": f"Bearer {values['SFTQ_API_KEY']}"},
    ).json()
    assert first["state"] == "CANCELLED" and first["started_at"] is not None, first

    # README's CLI block, in a shell that only sourced the env file.
    readme = run_sourced(work, runnable_blocks(README, at_least=1), timeout=120)
    assert readme.returncode == 0, f"stdout:\n{readme.stdout}\nstderr:\n{readme.stderr}"
    assert re.search(r"^state:\s+SUCCESS$", readme.stdout, re.M), readme.stdout
    assert "Traceback" not in readme.stderr, readme.stderr

    dev.send(signal.SIGTERM)
    assert dev.wait() == 0, dev.log()
