"""`reshard`: rewrite a checkpoint at this run's parallel layout, without training.

Loading already reshards (megatron/checkpointing/reshard.py); this runs that load on the
workers of the new layout and saves the result at once, so that the checkpoint on disk has the
new layout (for runs that must start without reading the old one, or to ship it).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import torch.distributed as dist

from megatron.checkpointing import load_checkpoint, save_checkpoint
from megatron.checkpointing.layout import MANIFEST_NAME
from megatron.checkpointing.load import LOADED_FROM
from megatron.checkpointing.manifest import read_manifest
from megatron.checkpointing.locate import reshard_source
from megatron.monitoring.progress import progress
from megatron.mpu.initialize import destroy_distributed, init_distributed


def reshard(args) -> Path:
    """Load `load` (the checkpoint its `latest` names, or `iteration`; never an older one in
    its place) at this run's layout and save it to `save` under the same iteration; returns the
    new checkpoint directory. A `save` directory this call created is removed when it fails.
    Collective."""
    iteration = reshard_source(args.checkpoint)  # deepy.py checked it too
    created = not Path(args.checkpoint.save).exists()
    init_distributed(args.parallelism.distributed_backend,
                     args.launcher.distributed_timeout_minutes, args.launcher)
    try:
        # the checkpoint's learning-rate schedule is part of the state kept whole, whatever
        # train_iters, lr or warmup the config has; override_lr_scheduler writes the config's
        keep = not args.lr_schedule.override_lr_scheduler
        return _reshard(args.replace(world_size=dist.get_world_size(), iteration=iteration,
                                     use_checkpoint_lr_scheduler=keep))
    except BaseException:
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        if created and rank == 0:
            shutil.rmtree(args.checkpoint.save, ignore_errors=True)
        raise
    finally:
        destroy_distributed()


def _reshard(args) -> Path:
    from megatron.training.loop import setup_engine

    from megatron.safety.lock import run_lock

    with run_lock(args.checkpoint.save), progress(total=3, desc="reshard", unit="step") as bar:
        engine = setup_engine(args)[0]
        bar.update()
        resumed = load_checkpoint(engine, args.checkpoint, advice=(
            "Restore the files from a backup, or reshard another checkpoint with "
            "iteration=<N>"), resharding=True)
        if not resumed:
            raise FileNotFoundError(f"no checkpoint to reshard in {args.checkpoint.load}")
        bar.update()
        engine.run = _as_loaded(engine.run, resumed.pop(LOADED_FROM, None))
        iteration = int(resumed.pop("iteration"))
        saved = save_checkpoint(engine, args.checkpoint, iteration, resumed)
        bar.update()
        dist.barrier()  # leave the process group together: no rank tears it down under another
    return saved


def _as_loaded(run, step_dir: str | None):
    """`run` without the position table's layout where the checkpoint in `step_dir` does not
    record it (a sinusoidal model of an earlier version, whose load warned): the weights are
    not retrained here, so the rewritten checkpoint must not claim the new layout. A GPT-NeoX
    checkpoint (no manifest) has that layout."""
    if step_dir is None or "position_table" not in run.shape:
        return run
    directory = Path(step_dir)
    if not (directory / MANIFEST_NAME).is_file():
        return run
    if "position_table" in read_manifest(directory).run:
        return run
    shape = {k: v for k, v in run.shape.items() if k != "position_table"}
    return dataclasses.replace(run, shape=shape)
