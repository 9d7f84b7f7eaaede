"""The Agent Skill (skills/finetune-queue): the agentskills frontmatter rules, every `sftq`
command, route, MCP tool and error code it names exists, the packaged copy is the same, and
`sftq skill install` writes it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from sftq_client.cli import _build_parser, main
from sftq_client.cli._server import SERVER_COMMANDS
from sftq_client.cli.skill import skill_files
from sftq_client.mcp.tools import TOOLS

ROOT = Path(__file__).resolve().parents[2]
SKILL = ROOT / "skills" / "finetune-queue"
PACKAGED = ROOT / "clients" / "sftq_client" / "skills" / "finetune-queue"
# The agentskills format's frontmatter fields.
ALLOWED_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
# Tool errors the MCP server itself gives (tools.py), before any API call.
MCP_CODES = {"invalid_arguments", "ambiguous_job_id", "timeout", "unknown_tool", "unavailable",
             "configuration", "internal"}


def texts() -> dict[str, str]:
    return {str(p.relative_to(SKILL)): p.read_text() for p in sorted(SKILL.rglob("*.md"))}


def frontmatter(text: str) -> tuple[dict[str, str], str]:
    assert text.startswith("---\n"), "SKILL.md must open with a frontmatter block"
    head, _, body = text[4:].partition("\n---\n")
    fields: dict[str, str] = {}
    for line in head.splitlines():
        key, sep, value = line.partition(":")
        assert sep and key.strip() == key and key, f"not a `key: value` line: {line!r}"
        assert key not in fields, f"{key} given twice"
        fields[key] = value.strip()
    return fields, body


def test_the_frontmatter_follows_the_agentskills_rules() -> None:
    fields, body = frontmatter((SKILL / "SKILL.md").read_text())
    assert set(fields) <= ALLOWED_KEYS
    assert fields["name"] == "finetune-queue" == SKILL.name
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", fields["name"]) and len(fields["name"]) <= 64
    description = fields["description"]
    assert 0 < len(description) < 1024
    # What it does and when to use it.
    assert "Use it whenever" in description and "instead of calling the Fireworks" in description
    # Under ~5,000 tokens (about 4 characters a token for English prose and code).
    assert len(body) / 4 < 5000
    for name in ("references/sft.md", "references/dpo.md", "references/rft.md"):
        assert name in body and (SKILL / name).is_file()


def _commands(text: str) -> list[str]:
    found = re.findall(r"`(sftq [^`]+)`", text)
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("sftq "):
                found.append(line.strip())
    return found


def test_every_sftq_command_the_skill_names_parses() -> None:
    parser = _build_parser()
    seen = 0
    for name, text in texts().items():
        for command in _commands(text):
            argv = shlex.split(command)[1:]
            seen += 1
            if argv[0] in SERVER_COMMANDS:
                continue
            try:
                ns = parser.parse_args(argv)
            except SystemExit as exc:  # argparse's way of refusing
                raise AssertionError(f"{name}: `{command}` does not parse") from exc
            assert ns.command == argv[0]
    assert seen >= 15


def test_every_route_the_skill_names_exists() -> None:
    spec = json.loads((ROOT / "docs" / "openapi.json").read_text())
    routes = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    named = set()
    for text in texts().values():
        for method, path in re.findall(r"`(GET|POST|DELETE|PUT|PATCH) (/[^`?\s]*)", text):
            named.add((method, path))
    assert len(named) >= 9
    assert named <= routes, named - routes
    # The MCP endpoint it names is the gateway's.
    from sftq_server.http.gateway import MCP_PREFIX

    assert "$SUPABASE_URL/functions/v1/mcp" in texts()["SKILL.md"]
    assert MCP_PREFIX == "/functions/v1/mcp"


def test_every_tool_and_error_code_the_skill_names_exists() -> None:
    text = texts()["SKILL.md"]
    table = set(re.findall(r"^\| `([a-z_]+)` \|", text, re.M))
    assert table >= {tool.name for tool in TOOLS}
    tools = {tool.name for tool in TOOLS}
    assert {t for t in table if t in tools} == tools
    errors = (ROOT / "docs" / "errors.md").read_text()
    section = text[text.index("## Errors you will meet"):]
    codes = {code for row in re.findall(r"^\| ([^|]+) \|", section, re.M)
             for code in re.findall(r"`([a-z_]+)`", row)}
    assert len(codes) >= 10
    for code in codes:
        assert f"| `{code}` |" in errors or code in MCP_CODES, code


def test_the_error_table_has_the_payload_check_and_the_text_agrees_with_it() -> None:
    text = texts()["SKILL.md"]
    section = text[text.index("## Errors you will meet"):]
    assert re.search(r"^\| `invalid_fireworks_payload` \| 400 \|", section, re.M)
    # The queue checks the payload's shape (preflight/shape.py): the skill must not say it
    # does not, anywhere.
    for name, body in texts().items():
        flat = " ".join(body.split())
        assert "does not check Fireworks' field names" not in flat, name
        assert "passed through as it is and fails at Fireworks" not in flat, name


def test_the_exit_codes_the_skill_lists_are_the_clis() -> None:
    from sftq_client.cli._common import EXIT_CODES

    flat = " ".join(texts()["SKILL.md"].split())
    listed = flat[flat.index("Exit codes:"):].split(".", 1)[0]
    codes = {int(n) for n in re.findall(r"(?:^|, |: )(\d+) ", listed)}
    assert codes == set(EXIT_CODES), (sorted(codes), sorted(EXIT_CODES))


def test_the_packaged_copy_is_the_skill() -> None:
    repo = {str(p.relative_to(SKILL)): p.read_bytes() for p in SKILL.rglob("*") if p.is_file()}
    packaged = {str(p.relative_to(PACKAGED)): p.read_bytes()
                for p in PACKAGED.rglob("*") if p.is_file()}
    # One skill, not two copies: the top-level folder is a link to the packaged one.
    assert SKILL.resolve() == PACKAGED.resolve(), "skills/finetune-queue must link to the package"
    assert packaged == repo
    assert skill_files() == repo  # what the installed package reads


def test_skill_install_writes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["skill", "install", str(tmp_path)]) == 0
    target = tmp_path / "finetune-queue"
    assert capsys.readouterr().out.strip() == str(target)
    for name, data in skill_files().items():
        assert (target / name).read_bytes() == data
    assert main(["skill", "install", str(tmp_path)]) == 0  # again: nothing to do
    assert "wrote" not in capsys.readouterr().err
    (target / "SKILL.md").write_text("edited")
    assert main(["skill", "install", str(tmp_path)]) == 5
    assert "--force" in capsys.readouterr().err
    assert (target / "SKILL.md").read_text() == "edited"
    assert main(["skill", "install", str(tmp_path), "--force"]) == 0
    assert (target / "SKILL.md").read_bytes() == skill_files()["SKILL.md"]


@pytest.mark.parametrize("force", [False, True])
def test_skill_install_never_writes_through_a_symlink(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], force: bool) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.md"
    victim.write_text("not yours")
    flag = ["--force"] if force else []
    # A link as SKILL.md, as the references folder, and as the skill folder itself.
    cases = {
        "SKILL.md": lambda target: (target / "SKILL.md").symlink_to(victim),
        "references": lambda target: (target / "references").symlink_to(outside),
        "finetune-queue": lambda target: target.symlink_to(outside),
    }
    for name, make in cases.items():
        skills = tmp_path / f"skills-{name}"
        skills.mkdir()
        target = skills / "finetune-queue"
        if name != "finetune-queue":
            target.mkdir()
        make(target)
        assert main(["skill", "install", str(skills), *flag]) == 5, name
        assert "symbolic link" in capsys.readouterr().err
        assert victim.read_text() == "not yours", name
        assert sorted(p.name for p in outside.iterdir()) == ["victim.md"], name
        # Nothing was written anywhere, not even the files that are not behind the link.
        assert not [p for p in skills.rglob("*") if p.is_file() and not p.is_symlink()
                    and outside not in p.resolve().parents], name


def test_skill_install_writes_each_file_atomically(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from sftq_client.cli import skill

    renames: list[tuple[Path, Path]] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        # At the rename the new content is complete in the temporary file beside the target.
        source, destination = Path(src), Path(dst)
        name = str(destination.relative_to(tmp_path / "finetune-queue"))
        assert source.parent == destination.parent and source.read_bytes() == skill_files()[name]
        renames.append((source, destination))
        real_replace(src, dst)

    monkeypatch.setattr(skill.os, "replace", replace)
    assert main(["skill", "install", str(tmp_path)]) == 0
    assert sorted(str(d.relative_to(tmp_path / "finetune-queue")) for _, d in renames) == \
        sorted(skill_files())
    # No temporary file is left behind, and a failed rename leaves the old file whole.
    assert sorted(str(p.relative_to(tmp_path / "finetune-queue"))
                  for p in (tmp_path / "finetune-queue").rglob("*") if p.is_file()) == \
        sorted(skill_files())
    (tmp_path / "finetune-queue" / "SKILL.md").write_text("edited")

    def failing(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(skill.os, "replace", failing)
    with pytest.raises(OSError):
        skill.install(tmp_path, force=True)
    assert (tmp_path / "finetune-queue" / "SKILL.md").read_text() == "edited"
    assert not list((tmp_path / "finetune-queue").rglob("*.tmp"))
