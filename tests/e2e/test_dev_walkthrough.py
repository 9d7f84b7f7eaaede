"""The walk-throughs in README.md and docs/dev.md, run verbatim against a live `sftq dev`."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, DevStacks, clean_env, wait_until

DOCS = [ROOT / "README.md", ROOT / "docs" / "dev.md"]
BLOCK = re.compile(r"^```bash walkthrough\n(.*?)^```$", re.S | re.M)


def walkthrough_blocks(doc: Path) -> list[str]:
    blocks = BLOCK.findall(doc.read_text(encoding="utf-8"))
    assert len(blocks) >= 5, f"{doc.name} lost its walkthrough blocks"
    return blocks


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_docs_walkthrough_works_verbatim(stacks: DevStacks, tmp_path: Path, doc: Path) -> None:
    # As the page says: `sftq dev` in a folder (defaults but for the ports, so the test can run
    # next to a real stack), then the blocks, pasted in order into one shell in that folder.
    work = tmp_path / "project"
    work.mkdir()
    dev = stacks.start(work / ".sftq", cwd=work, tick_interval=30, job_seconds=60)
    values = dev.wait_ready()
    # The ticker fires its first tick at once. A person takes longer than that to paste the
    # first block; the test waits for it, so its own tick does not meet a held lease.
    wait_until(
        lambda: re.search(r"^tick \d+ \w+:", dev.log(), re.M) is not None,
        30,
        "the ticker's first tick",
    )

    script = "set -euo pipefail\n" + "\n".join(walkthrough_blocks(doc))
    run = subprocess.run(
        ["bash", "-c", script],
        cwd=work,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}\n{dev.log()}"
    out = run.stdout
    assert run.stderr == "", run.stderr

    job_id = re.search(r"^queued: ([0-9a-f-]{36})$", out, re.M)
    assert job_id, out
    for state in ("PROGRESS", "JOB_STATE_COMPLETED", "SUCCESS"):
        assert re.search(rf'"state"\s*:\s*"{state}"', out), out
    assert not re.search(r'"error"\s*:\s*"', out), out
    assert '"success_rate"' in out and '"global_queue_depth"' in out and '"timeline"' in out

    # And the stack agrees.
    r = httpx.get(
        f"{values['SUPABASE_URL']}/functions/v1/jobs-api/jobs/{job_id.group(1)}",
        headers={"Authorization": f"Bearer {values['SFTQ_API_KEY']}"},
    )
    assert r.json()["state"] == "SUCCESS"

    dev.send(signal.SIGTERM)
    assert dev.wait() == 0, dev.log()
