"""Sentences of the docs that the code can contradict, held against the code (issue 18.9)."""

from __future__ import annotations

import re
import tomllib

from conftest import ROOT


def test_the_readme_says_the_per_user_cap_is_a_default() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert not re.search(r"one running job per user\*\*(?! by default)", readme)
    assert "sftq admin set-cap" in readme
    # The default itself: a new user may run one job at once.
    sql = (ROOT / "sql" / "procedures" / "020_users_keys.sql").read_text()
    assert "sftq.create_user(p_name text, p_max_running integer DEFAULT 1)" in sql


def test_performance_md_agrees_with_the_bench_extra_about_granian() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    in_bench = any(dep.startswith("granian") for dep in extras["bench"])
    text = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    assert in_bench
    assert (
        "needs adding to the `server` extra (or the deployment image) to use it, and to the "
        "`bench` extra" not in text
    )
    assert "granian is in the `bench` extra" in text


def test_cli_and_client_docs_say_a_running_job_is_cancelled_at_once() -> None:
    # The PROGRESS case answers 200 and CANCELLED once Fireworks has answered; 202 is the
    # exception (Fireworks unreachable, or not yet submitted). Behaviour: test_cli_doc.py and
    # test_client_live.py.
    for name in ("cli.md", "client.md"):
        text = " ".join((ROOT / "docs" / name).read_text().split())
        assert "A PROGRESS job is handed to the scheduler" not in text, name
        assert "The job was PROGRESS: the server answers 202" not in text, name
        assert "200" in text and "202" in text, name
