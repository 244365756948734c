"""Which old checkpoints to delete (keep_last_n_checkpoints), and removing what interrupted saves
left behind (A20). When to save is `megatron.neox_arguments.derived.should_save`."""

from __future__ import annotations

import shutil
from pathlib import Path

from megatron.checkpointing.durable import discard_dir
from megatron.checkpointing.locate import newest_good_iteration
from megatron.checkpointing.layout import (DELETING_PREFIX, iteration_of, leftovers,
                                          saved_iterations, tag_for)
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)


def to_delete(iterations: list[int], keep_last: int | None, protect: set[int]) -> list[int]:
    """The iterations to delete so that the newest `keep_last` remain; never one in `protect`."""
    if not keep_last or keep_last < 1:
        return []
    ordered = sorted(iterations)
    return [i for i in ordered[:-keep_last] if i not in protect]


def apply_retention(save_dir: Path, keep_last: int | None, latest_tag: str,
                    in_use: tuple[str, ...] = ()) -> list[int]:
    """Delete old checkpoint directories beyond `keep_last`; never the one `latest` names, nor
    those in `in_use` (the checkpoint this process loaded: its files back mapped tensors), nor
    the newest one whose recorded loss is finite (what a rollback returns to)."""
    protect = {i for i in map(iteration_of, (latest_tag, *in_use)) if i is not None}
    protect |= {i for i in [newest_good_iteration(save_dir)] if i is not None}
    removed = to_delete(saved_iterations(save_dir), keep_last, protect)
    for old in removed:
        tag = tag_for(old)
        discard_dir(save_dir / tag, save_dir / (DELETING_PREFIX + tag))
        log.info("removed old checkpoint %s (keep_last_n_checkpoints=%d)", tag, keep_last)
    return removed


def remove_leftovers(save_dir: Path) -> list[Path]:
    """Delete staging directories and temporary files of interrupted saves under `save_dir`.

    Only rank 0 calls it, while no save is in progress (saves are collective and synchronous).
    """
    found = leftovers(save_dir)
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        log.warning("removed %s, left behind by an interrupted checkpoint save", path)
    return found
