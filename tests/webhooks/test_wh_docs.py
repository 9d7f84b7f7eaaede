"""docs/webhooks.md's shell recipes work: the openssl check verifies a real delivery (and
refuses a changed one), and the curl recipe sends a request the Standard Webhooks library
accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from fn_support import Api
from wh_support import Receiver, verify

from sftq_server import webhooks

DOC = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")


def shell_blocks() -> list[str]:
    section = DOC.read_text().split("### curl and openssl", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)


def run(script: str, cwd: Path, **env: str) -> str:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_shell_recipes(dev_api: Api, alice: str, tmp_path: Path,
                           make_receiver: Callable[..., Receiver],
                           make_deliverer: Callable[..., webhooks.Deliverer]) -> None:
    check, send = shell_blocks()
    receiver = make_receiver()
    secret = dev_api.post("/webhooks", alice, json={"url": receiver.url, "events": ["job.*"]}
                          ).json["secret"]  # type: ignore[index]
    dev_api.enqueue(alice)
    make_deliverer().run(threading.Event(), until_idle=True)
    (got,) = receiver.wait_for(1)
    (tmp_path / "body.json").write_bytes(got.body)
    # The block with the real values in place of the example's.
    values = {"SECRET": secret, "WEBHOOK_ID": got.headers["webhook-id"],
              "WEBHOOK_TIMESTAMP": got.headers["webhook-timestamp"],
              "SIGNATURE": got.headers["webhook-signature"]}
    script = "\n".join(line for line in check.splitlines()
                       if line.split("=", 1)[0] not in values)
    env = {"PATH": "/usr/bin:/bin", **values}
    assert run(script, tmp_path, **env).strip() == "verified"
    (tmp_path / "body.json").write_bytes(got.body.replace(b"QUEUED", b"SUCCESS"))
    assert run(script, tmp_path, **env).strip() == "signature does not match"

    # The curl recipe (after the key_hex line of the first block) reaches a receiver verified.
    key_line = next(line for line in check.splitlines() if line.startswith("key_hex="))
    other = make_receiver()
    run(key_line + "\n" + send, tmp_path, PATH="/usr/bin:/bin", SECRET=secret,
        RECEIVER_URL=other.url)
    (manual,) = other.wait_for(1)
    assert verify(secret, manual)["data"] == {"message": "by hand"}
