"""examples/*.json: valid Fireworks bodies by the simulator's checks, and `sftq submit
--payload examples/<kind>.json` (no --kind: the file's name tells it) works as the docs write it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ROOT, DevStacks, clean_env, run_sftq

# The one place this test touches the simulator's code.
from sftq_server.simulator import validate_payload

EXAMPLES = {kind: ROOT / "examples" / f"{kind.lower()}.json" for kind in ("SFT", "DPO", "RFT")}


def load(kind: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EXAMPLES[kind].read_text())
    return data


@pytest.mark.parametrize("kind", EXAMPLES)
def test_each_example_passes_the_simulators_validation(kind: str) -> None:
    payload = load(kind)
    validate_payload(kind, payload)
    # The check bites: without its dataset the same body is refused.
    with pytest.raises(Exception, match="dataset"):
        validate_payload(kind, {k: v for k, v in payload.items() if k != "dataset"})


def test_sftq_submit_takes_the_examples_as_written(stacks: DevStacks, db_url: str) -> None:
    dev = stacks.start(database_url=db_url)
    values = dev.wait_ready()
    # Three jobs at once for the demo user.
    assert run_sftq("admin", "set-cap", "demo", "3", "--database-url", db_url).returncode == 0
    env = clean_env(SUPABASE_URL=values["SUPABASE_URL"], SFTQ_API_KEY=values["SFTQ_API_KEY"])
    ids = {}
    for kind in EXAMPLES:
        # Issue 18.8's command as written: no --kind, the file's name tells it.
        r = run_sftq("submit", "--payload", f"examples/{kind.lower()}.json", env=env, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        found = re.search(r"^queued ([0-9a-f-]{36}) ", r.stdout, re.M)
        assert found, r.stdout
        ids[kind] = found.group(1)
    # One admission per user per tick: three ticks submit the three to the simulator.
    for _ in EXAMPLES:
        tick = httpx.post(
            f"{values['SUPABASE_URL']}/functions/v1/scheduler-tick",
            headers={"Authorization": f"Bearer {values['SFTQ_TICK_SECRET']}"},
        )
        assert tick.status_code == 200 and tick.json()["submitted"] == 1, tick.text
    for kind, job_id in ids.items():
        r = run_sftq("get", job_id, "--json", env=env)
        job = json.loads(r.stdout)
        assert job["state"] == "PROGRESS" and job["error"] is None, (kind, job)
        assert job["kind"] == kind and job["fireworks_job_name"]


def test_the_docs_point_at_the_examples() -> None:
    for doc in (ROOT / "README.md", ROOT / "docs" / "cli.md"):
        text = doc.read_text()
        assert "examples/sft.json" in text, doc.name
    for path in EXAMPLES.values():
        assert isinstance(json.loads(Path(path).read_text()), dict)
