"""Saving a checkpoint: DeepSpeed's engine state plus our client state and the resolved config."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch.distributed as dist

from megatron.checkpointing.layout import CONFIG_NAME, saved_iterations, tag_for
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)


def should_save(iteration: int, factor: int | None, scale: str, extra_iters) -> bool:
    """GPT-NeoX's rule: every `factor` iterations (linear) or at powers of `factor` (log)."""
    if extra_iters and iteration in set(extra_iters):
        return True
    if not factor or iteration <= 0:
        return False
    if scale == "log":
        if factor < 2:
            return False
        power = round(math.log(iteration, factor))
        return factor**power == iteration
    return iteration % factor == 0


def save_checkpoint(engine, args, iteration: int, client_state: dict) -> Path:
    """Write `<save>/global_step<iteration>/` on every rank and point `<save>/latest` at it."""
    save_dir = Path(args.checkpoint.save)
    tag = tag_for(iteration)
    state = {"iteration": iteration, **client_state}
    engine.engine.save_checkpoint(str(save_dir), tag=tag, client_state=state, save_latest=True)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        args.save_yml(save_dir / tag / CONFIG_NAME)
        _apply_retention(save_dir, args.checkpoint.keep_last_n_checkpoints, keep=iteration)
    if dist.is_initialized():
        dist.barrier()
    log.info("saved checkpoint %s", save_dir / tag)
    return save_dir / tag


def _apply_retention(save_dir: Path, keep_last: int | None, keep: int) -> None:
    """Delete all but the newest `keep_last` checkpoints (never the one just written)."""
    if not keep_last or keep_last < 1:
        return
    iterations = saved_iterations(save_dir)
    for old in iterations[:-keep_last]:
        if old != keep:
            shutil.rmtree(save_dir / tag_for(old), ignore_errors=True)
            log.info("removed old checkpoint %s (keep_last_n_checkpoints=%d)", tag_for(old), keep_last)
