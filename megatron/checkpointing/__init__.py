"""Checkpoints: when to save, atomic verified saves in DeepSpeed's layout, verified loading.

    save_checkpoint(engine, args, iteration, client_state) -> Path   (save.py)
    load_checkpoint(engine, args) -> dict                            (load.py)
    should_save(iteration, factor, scale, extra_iters) -> bool       (retention.py)

One module per kind of state: engine_state (weights, optimizer, LR schedule through DeepSpeed),
rng, data_position (client state), manifest + compatibility (metadata); durable holds the file
primitives (hash while writing, fsync, atomic rename, retries), layout the names on disk.
"""

from megatron.checkpointing.errors import (CheckpointError, CheckpointMismatchError,
                                           CheckpointSaveError, CorruptFileError,
                                           NoValidCheckpointError)
from megatron.checkpointing.load import load_checkpoint
from megatron.checkpointing.retention import should_save
from megatron.checkpointing.save import save_checkpoint

__all__ = ["load_checkpoint", "save_checkpoint", "should_save", "CheckpointError",
           "CheckpointMismatchError", "CheckpointSaveError", "CorruptFileError",
           "NoValidCheckpointError"]
