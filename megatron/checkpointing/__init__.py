"""Checkpoints: when to save, atomic verified saves in DeepSpeed's layout, verified loading.

    save_checkpoint(engine, ck, iteration, client_state) -> Path   (save.py)
    load_checkpoint(engine, ck) -> dict                            (load.py)
    read_checkpoint(load, iteration) -> CheckpointWeights          (reader.py: generation,
                                                                    eval, export)
    should_save(iteration, factor, scale, extra_iters) -> bool     (the save schedule, defined
                                                                    with the config it reads)
`ck` is the checkpoint section of the config; `engine.run` (run.py) describes the run.

This package owns every read and write of checkpoint files. One module per kind of state:
engine_state (weights, optimizer, LR schedule through DeepSpeed), optimizer_layouts (how
DeepSpeed's optimizers hold their state: the one module touching its internals), rng,
data_position (client state), manifest + compatibility + model_shape (metadata), weights and
reshard (layout-free state), reader (verified weights for inference). locate picks and
verifies the step directory for every reader; durable holds the file primitives (hash while
writing, fsync, atomic rename, retries), layout the names on disk.
"""

from megatron.checkpointing.errors import (CheckpointError, CheckpointMismatchError,
                                           CheckpointSaveError, CorruptFileError,
                                           NoValidCheckpointError)
from megatron.checkpointing.load import load_checkpoint
from megatron.checkpointing.reader import read_checkpoint
from megatron.checkpointing.save import save_checkpoint
from megatron.neox_arguments.derived import should_save

__all__ = ["load_checkpoint", "read_checkpoint", "save_checkpoint", "should_save",
           "CheckpointError", "CheckpointMismatchError", "CheckpointSaveError", "CorruptFileError",
           "NoValidCheckpointError"]
