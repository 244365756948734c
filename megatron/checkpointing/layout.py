"""Names on disk: DeepSpeed's `<save>/global_step<N>/` and `<save>/latest`, plus our own.

    <save>/latest                          text: the tag of the newest committed checkpoint
    <save>/global_step<N>/                 one committed checkpoint
        manifest.json                      what is inside and its checksums (manifest.py)
        config.yml                         the resolved run config
        rng/rank_<r>.pt                    random-number-generator states of global rank r
        shards/rank_<r>.json               which parameters rank r's files hold (shard_index.py)
        mp_rank_*, layer_*, *zero_pp_rank* DeepSpeed's model / optimizer files
    <save>/.staging-global_step<N>/        a save in progress (A20); renamed when complete
    <save>/.replaced-global_step<N>/       a checkpoint being replaced by a re-save of N
    <save>/.deleting-global_step<N>/       a checkpoint being removed by retention
Dot-prefixed directories and `latest.tmp*` files are never loaded; a later save or load removes
them (they are what a crash leaves behind).
"""

from __future__ import annotations

import re
from pathlib import Path

LATEST = "latest"
CONFIG_NAME = "config.yml"
MANIFEST_NAME = "manifest.json"
RNG_DIR = "rng"
STAGING_PREFIX = ".staging-"
REPLACED_PREFIX = ".replaced-"
DELETING_PREFIX = ".deleting-"
_LEFTOVER_PREFIXES = (STAGING_PREFIX, REPLACED_PREFIX, DELETING_PREFIX)
_TAG = re.compile(r"^global_step(\d+)$")


def tag_for(iteration: int) -> str:
    return f"global_step{iteration}"


def iteration_of(tag: str) -> int | None:
    match = _TAG.match(tag)
    return int(match.group(1)) if match else None


def staging_tag(tag: str) -> str:
    """The directory name a save of `tag` writes into before it is committed."""
    return STAGING_PREFIX + tag


def rng_file(rank: int) -> str:
    """Path of global rank `rank`'s RNG states, relative to the checkpoint directory."""
    return f"{RNG_DIR}/rank_{rank}.pt"


def read_latest(save_dir: str | Path) -> str | None:
    """The tag `latest` names, or None when there is no `latest` file (or it is empty)."""
    path = Path(save_dir) / LATEST
    if not path.is_file():
        return None
    return path.read_text(encoding="utf-8", errors="replace").strip() or None


def saved_iterations(save_dir: str | Path) -> list[int]:
    """Iterations of the committed checkpoint directories under save_dir, oldest first."""
    root = Path(save_dir)
    if not root.is_dir():
        return []
    found = (iteration_of(p.name) for p in root.iterdir() if p.is_dir())
    return sorted(i for i in found if i is not None)


def leftovers(save_dir: str | Path) -> list[Path]:
    """What interrupted saves and deletions left under save_dir (never a committed checkpoint)."""
    root = Path(save_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if p.name.startswith(_LEFTOVER_PREFIXES) or p.name.startswith(LATEST + ".tmp"))


def manifest_digest(step_dir: Path) -> str | None:
    """sha256 of a step directory's manifest.json (its files' sizes and checksums), or None
    where it has none."""
    import hashlib

    manifest = Path(step_dir) / MANIFEST_NAME
    return hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None
