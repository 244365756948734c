"""Names on disk: `<save>/global_step<N>/` per checkpoint, `<save>/latest` naming the newest."""

from __future__ import annotations

import re
from pathlib import Path

LATEST = "latest"
CONFIG_NAME = "config.yml"
_TAG = re.compile(r"^global_step(\d+)$")


def tag_for(iteration: int) -> str:
    return f"global_step{iteration}"


def iteration_of(tag: str) -> int | None:
    match = _TAG.match(tag)
    return int(match.group(1)) if match else None


def read_latest(save_dir: str | Path) -> str | None:
    """The tag `latest` names, or None when there is no `latest` file."""
    path = Path(save_dir) / LATEST
    if not path.is_file():
        return None
    return path.read_text().strip() or None


def saved_iterations(save_dir: str | Path) -> list[int]:
    """Iterations of the checkpoint directories under save_dir, oldest first."""
    root = Path(save_dir)
    if not root.is_dir():
        return []
    found = (iteration_of(p.name) for p in root.iterdir() if p.is_dir())
    return sorted(i for i in found if i is not None)
