"""The dev stack's env file (<data-dir>/env): KEY=value lines another shell can source."""

from __future__ import annotations

from pathlib import Path


def read_env_file(data_dir: str | Path) -> dict[str, str]:
    path = Path(data_dir) / "env"
    if not path.is_file():
        return {}
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export ") :]
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip("'\"")
    return values
