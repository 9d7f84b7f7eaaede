"""``sftq skill install [DIR]``: write the finetune-queue Agent Skill (SKILL.md and its
references/) into DIR/finetune-queue, for an agent that loads skills from DIR.

The files ship inside the package (sftq_client/skills/finetune-queue, a copy of the
repository's skills/finetune-queue that a test keeps equal), so an installed client has them.
"""

from __future__ import annotations

import argparse
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Final

from ._common import EXIT_CONFLICT, EXIT_OK, CommandFactory, Context, err, out

SKILL_NAME: Final = "finetune-queue"
DEFAULT_DIR: Final = ".claude/skills"


def skill_files() -> dict[str, bytes]:
    """The packaged skill: relative path -> content."""
    root = files("sftq_client") / "skills" / SKILL_NAME
    found: dict[str, bytes] = {}

    def walk(node: Traversable, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(".md"):
                found[prefix + child.name] = child.read_bytes()

    walk(root, "")
    return found


def install(directory: Path, *, force: bool = False) -> tuple[Path, list[str]]:
    """Write the skill under directory/finetune-queue; the folder and the files it changed.
    FileExistsError (nothing written) when a file there differs and `force` is not given."""
    target = directory / SKILL_NAME
    wanted = skill_files()
    changed = [name for name, data in wanted.items()
               if not (target / name).is_file() or (target / name).read_bytes() != data]
    differing = [name for name in changed if (target / name).exists()]
    if differing and not force:
        raise FileExistsError(", ".join(differing))
    for name in changed:
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(wanted[name])
    return target, changed


def _cmd_install(args: argparse.Namespace, ctx: Context) -> int:
    try:
        target, changed = install(Path(args.dir), force=args.force)
    except FileExistsError as exc:
        err(f"error: {Path(args.dir) / SKILL_NAME} has edited files ({exc}); "
            "pass --force to overwrite them")
        return EXIT_CONFLICT
    for name in changed:
        err(f"wrote {target / name}")
    out(str(target))
    return EXIT_OK


def register(command: CommandFactory) -> None:
    p = command("skill", "the Agent Skill that teaches an agent to use the queue")
    sub = p.add_subparsers(dest="skill_command", metavar="<subcommand>", required=True)
    i = sub.add_parser("install", help="write the finetune-queue skill into DIR/finetune-queue",
                       description="write the finetune-queue skill (SKILL.md, references/) "
                       "into DIR/finetune-queue")
    i.add_argument("dir", nargs="?", default=DEFAULT_DIR, metavar="DIR",
                   help=f"the agent's skills folder (default: {DEFAULT_DIR})")
    i.add_argument("--force", action="store_true",
                   help="overwrite files that differ from the packaged skill")
    i.set_defaults(handler=_cmd_install)
