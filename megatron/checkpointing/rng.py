"""Random-number-generator states: captured per rank at save, restored at load.

Each rank writes `rng/rank_<r>.pt` holding Python's `random`, NumPy's global generator, torch's
CPU generator, every CUDA device's generator (only where CUDA is initialised, A6) and the
tensor-parallel dropout stream (`megatron.mpu.random.TensorParallelRNG`) when the run has one.
Restoring them makes dropout after a resume draw what the uninterrupted run would have drawn.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from megatron.checkpointing.durable import FileRecord, load_torch_verified, write_torch

RNG_FORMAT = 1


def capture(tp_rng=None) -> dict:
    """This process's generator states (and `tp_rng`'s, a TensorParallelRNG or None)."""
    state = {"format": RNG_FORMAT, "python": random.getstate(), "numpy": np.random.get_state(),
             "torch_cpu": torch.get_rng_state(), "cuda": None, "tensor_parallel": None}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if tp_rng is not None:
        state["tensor_parallel"] = tp_rng.state_dict()
    return state


def restore(state: dict, tp_rng=None) -> list[str]:
    """Set the generators from `state`; returns what could not be restored (for a warning)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch_cpu"])
    skipped = []
    if state.get("cuda") is not None:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(state["cuda"]):
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            skipped.append(f"CUDA generators of {len(state['cuda'])} devices (this process has "
                           f"{torch.cuda.device_count() if torch.cuda.is_available() else 0})")
    if tp_rng is not None:
        if state.get("tensor_parallel") is not None:
            tp_rng.load_state_dict(state["tensor_parallel"])
        else:
            skipped.append("the tensor-parallel dropout stream (not in the checkpoint)")
    return skipped


def save(checkpoint_dir: Path, relative: str, tp_rng=None) -> FileRecord:
    """Write this process's states to `checkpoint_dir/relative` (directories created)."""
    path = checkpoint_dir / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_torch(capture(tp_rng), path)


def load(checkpoint_dir: Path, relative: str, record: FileRecord) -> dict:
    """The states saved in `checkpoint_dir/relative`, checked against `record`."""
    return load_torch_verified(checkpoint_dir / relative, record)
