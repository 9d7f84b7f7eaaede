"""Sentences of the docs that the code can contradict, held against the code (issue 18.9)."""

from __future__ import annotations

import json
import re
import tomllib

import httpx
from conftest import ROOT, DevStacks

# A sentence that states the per-user cap as if it were fixed at one.
FIXED_CAP = re.compile(r"at most one running job per user(?! by default)", re.I)


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
    # The image runs granian already (its CMD): the page must not tell operators to add it.
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r'^CMD \["granian"', dockerfile, re.M)
    assert "add it to the deployment image" not in text
    assert "the deployment image (the `Dockerfile`) already serves with it" in text


def test_the_openapi_description_says_the_per_user_cap_is_a_default(
    stacks: DevStacks, db_url: str
) -> None:
    # docs/openapi.json, and the document the jobs-api serves (the same bytes, read from a live
    # `sftq dev`): the cap is configurable, 1 by default.
    doc = json.loads((ROOT / "docs" / "openapi.json").read_text())
    dev = stacks.start(database_url=db_url, tick_interval=0, job_seconds=0)
    values = dev.wait_ready()
    served = httpx.get(f"{values['SUPABASE_URL']}/functions/v1/jobs-api/openapi.json", timeout=30)
    assert served.status_code == 200, served.text
    for description in (doc["info"]["description"], served.json()["info"]["description"]):
        assert not FIXED_CAP.search(description), description
        assert "1 by default" in description, description


def test_cli_and_client_docs_say_a_running_job_is_cancelled_at_once() -> None:
    # The PROGRESS case answers 200 and CANCELLED once Fireworks has answered; 202 is the
    # exception (Fireworks unreachable, or not yet submitted). Behaviour: test_cli_doc.py and
    # test_client_live.py.
    for name in ("cli.md", "client.md"):
        text = " ".join((ROOT / "docs" / name).read_text().split())
        assert "A PROGRESS job is handed to the scheduler" not in text, name
        assert "The job was PROGRESS: the server answers 202" not in text, name
        assert "200" in text and "202" in text, name


def test_operations_md_disables_users_with_the_admin_commands() -> None:
    # Issue 18.7: `sftq admin disable-user` / `enable-user`, not SQL by hand, with what happens
    # to the user's jobs said as docs/dev.md and `disable-user --help` (admin.DISABLE_HELP) say it.
    from sftq_server.dev.admin import DISABLE_HELP

    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("### Revoking a key, disabling a user")
    section = " ".join(text[start : text.index("\n### ", start + 1)].split())
    assert "set_user_disabled" not in section
    assert "sftq admin disable-user alice" in section and "sftq admin enable-user alice" in section
    for claim in (
        "answers `401` on every route",
        "The keys are not revoked",
        "QUEUED jobs stay queued but are never admitted",
        "place in the FIFO order",
        "PROGRESS jobs keep running at Fireworks until they end",
        "count against the GPU budget",
        "cannot cancel them while disabled",
    ):
        assert claim in section, claim
    help_text = " ".join(DISABLE_HELP.split())
    for claim in (
        "answer 401 on every route",
        "not revoked",
        "QUEUED jobs stay queued",
        "FIFO order",
        "PROGRESS jobs keep running at Fireworks",
        "GPU budget",
        "cannot cancel while disabled",
    ):
        assert claim in help_text, claim


def _long_options(parser: object) -> set[str]:
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= _long_options(child)
        found |= {o for o in action.option_strings if o.startswith("--")}
    return found - {"--help", "--api-key", "--api-url"}


def test_each_synopsis_of_cli_md_names_every_option_of_its_command() -> None:
    """Issue 54.16: `submit`'s synopsis lacked --dry-run and --no-validate. Each command whose
    section opens with a synopsis block (```` ``` ```` then `sftq NAME ...`) lists every long option
    the command takes."""
    import argparse

    from sftq_client import cli

    doc = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    parser = cli._build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    checked = []
    for name, sub in commands.choices.items():
        section = re.search(rf"^### {name}\n(.*?)(?=^##)", doc, re.S | re.M)
        if section is None:
            continue
        block = re.search(r"^```\n(.*?)^```$", section.group(1), re.S | re.M)
        if block is None or not block.group(1).startswith(f"sftq {name}"):
            continue
        missing = sorted(o for o in _long_options(sub) if o not in block.group(1))
        assert missing == [], f"docs/cli.md's `{name}` synopsis lacks {missing}"
        checked.append(name)
    assert {"submit", "list", "wait", "analytics", "webhooks"} <= set(checked), checked


def test_dev_md_names_every_child_of_sftq_dev() -> None:
    """Issue 54.16: docs/dev.md listed three children of `sftq dev` where there are four."""
    from sftq_server.dev.stack import children

    source = (ROOT / "functions" / "sftq_server" / "dev" / "stack" / "children.py").read_text()
    names = re.findall(r'ChildSpec\(\s*"([a-z]+)"', source)
    assert sorted(names) == ["gateway", "simulator", "ticker", "webhooks"], names
    assert children.stack_children  # the table the names come from
    text = (ROOT / "docs" / "dev.md").read_text(encoding="utf-8")
    paragraph = text[text.index("`sftq dev` is a supervisor."):][:600]
    words = {"simulator": "simulator", "gateway": "gateway", "webhooks": "webhook deliverer",
             "ticker": "ticker"}
    for name in names:
        assert words[name] in paragraph, (name, paragraph)
