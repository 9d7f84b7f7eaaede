"""``sftq skill install [DIR]``: write the finetune-queue Agent Skill (SKILL.md and its
references/) into DIR/finetune-queue, for an agent that loads skills from DIR.

The files ship inside the package (sftq_client/skills/finetune-queue, a copy of the
repository's skills/finetune-queue that a test keeps equal), so an installed client has them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
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


class SymlinkRefused(Exception):
    """A path under DIR that install would write through is a symbolic link."""


def _levels(target: Path, relative: Path) -> list[Path]:
    """target, then each path from it down to target/relative."""
    levels = [target]
    for part in relative.parts:
        levels.append(levels[-1] / part)
    return levels


def _check_no_links(target: Path, names: list[str]) -> None:
    """Refuse (SymlinkRefused, nothing written) when DIR/finetune-queue, a folder below it or
    a file it would write is a symbolic link: a link there could send the write outside DIR."""
    for name in names:
        relative = Path(name)
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"bad skill file name {name!r}")
        for path in _levels(target, relative):
            if path.is_symlink():
                raise SymlinkRefused(str(path))


def _read_existing(path: Path) -> bytes | None:
    """The file's bytes, None when there is none; never through a link (checked before)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _write_atomically(path: Path, data: bytes) -> None:
    """A temporary file in the same folder, then os.replace: a reader sees the old file or the
    new one, never half of one; os.replace swaps the name itself and never follows a link."""
    folder = path.parent
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
        if path.is_symlink() or folder.is_symlink():  # a link made since the check
            raise SymlinkRefused(str(path))
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _make_folder(target: Path, folder: Path) -> None:
    """Make `folder` (target or below it) one level at a time, refusing a link at each."""
    for path in _levels(target, folder.relative_to(target)):
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        if path.is_symlink():
            raise SymlinkRefused(str(path))


def install(directory: Path, *, force: bool = False) -> tuple[Path, list[str]]:
    """Write the skill under directory/finetune-queue; the folder and the files it changed.

    DIR itself is the caller's choice (it may be a link, e.g. a dotfiles folder); below it
    nothing is written through a symbolic link: a link as DIR/finetune-queue, as a folder in
    it or as one of its files is refused (SymlinkRefused, nothing written), with or without
    `force`. Each file is written atomically (a temporary file beside it, then a rename).
    FileExistsError (nothing written) when a file there differs and `force` is not given."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / SKILL_NAME
    wanted = skill_files()
    _check_no_links(target, list(wanted))
    current = {name: _read_existing(target / name) for name in wanted}
    changed = [name for name, data in wanted.items() if current[name] != data]
    differing = [name for name in changed if current[name] is not None]
    if differing and not force:
        raise FileExistsError(", ".join(differing))
    for name in changed:
        path = target / name
        _make_folder(target, path.parent)
        _write_atomically(path, wanted[name])
    return target, changed


def _cmd_install(args: argparse.Namespace, ctx: Context) -> int:
    try:
        target, changed = install(Path(args.dir), force=args.force)
    except FileExistsError as exc:
        err(f"error: {Path(args.dir) / SKILL_NAME} has edited files ({exc}); "
            "pass --force to overwrite them")
        return EXIT_CONFLICT
    except SymlinkRefused as exc:
        err(f"error: {exc} is a symbolic link; sftq skill install never writes through one "
            "(not even with --force): remove the link, or install into the folder it names")
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
