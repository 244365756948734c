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
from megatron.neox_arguments.derived import should_save

# imported on first use (PEP 562): they import torch, which what reads only a checkpoint's
# metadata (deepy.py's checks before any worker starts) does without
_LAZY = {"load_checkpoint": "megatron.checkpointing.load",
         "read_checkpoint": "megatron.checkpointing.reader",
         "save_checkpoint": "megatron.checkpointing.save"}

__all__ = ["load_checkpoint", "read_checkpoint", "save_checkpoint", "should_save",
           "CheckpointError", "CheckpointMismatchError", "CheckpointSaveError", "CorruptFileError",
           "NoValidCheckpointError"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
