"""Which parameters each rank's files hold, and in what order: what resharding reads.

Every rank writes `shards/rank_<r>.json` into each checkpoint:

    {"format": 1, "rank": 3, "pipe": 1, "data": 1, "model": 0, "tp": 2,
     "optimizer": "flat",                          # "torch", "flat" or "none"
     "model_file": "mp_rank_01_model_states.pt",    # LR schedule, counters (and "torch" state)
     "optimizer_file": "zero_pp_rank_1_mp_rank_01_optim_states.pt",   # "flat" only
     "groups": [[["2.attention.dense.weight", [64, 32]], ...], ...]}

"groups" lists, per optimizer parameter group, the canonical names and local (tensor-parallel
shard) shapes of the parameters in the order the optimizer holds them:
- "torch": a torch optimizer's state dict in the model file, indexed by that order;
- "flat": DeepSpeed's bf16 optimizer or ZeRO stage 1/2, which lay each group's parameters end
  to end in one fp32 buffer (padding only at the end) and split it into equal parts over the
  data-parallel ranks; the part of data-parallel rank d is in that rank's optimizer file.
- "zero3": ZeRO stage 3, which splits every parameter into ceil(numel / dp) parts (the last
  one padded) and lays rank d's parts of a (sub)group's parameters end to end in its file.
  Shapes are the full (tensor-parallel shard) shapes, not the partitions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from megatron.checkpointing.durable import FileRecord, write_bytes
from megatron.model.partition import canonical_param_name

INDEX_FORMAT = 1
INDEX_DIR = "shards"


def index_file(rank: int) -> str:
    """Path of global rank `rank`'s index, relative to the checkpoint directory."""
    return f"{INDEX_DIR}/rank_{rank}.json"


def optimizer_kind(optimizer) -> str:
    """"flat" (DeepSpeed bf16 / ZeRO 1-2 wrapper), "zero3", "torch" (a plain torch optimizer)
    or "none"."""
    if optimizer is None:
        return "none"
    if hasattr(optimizer, "bf16_groups") or hasattr(optimizer, "bit16_groups"):
        return "flat"
    if hasattr(optimizer, "fp32_partitioned_groups_flat"):
        return "zero3"
    if hasattr(optimizer, "param_groups") and not hasattr(optimizer, "dp_process_group"):
        return "torch"
    return "none"


def flat_groups(optimizer) -> list[list]:
    """The parameter groups of a "flat" optimizer wrapper, in buffer order."""
    if hasattr(optimizer, "bf16_groups"):
        return optimizer.bf16_groups
    return getattr(optimizer, "round_robin_bit16_groups", None) or optimizer.bit16_groups


def describe(engine, root: Path, tag: str, save_optimizer: bool) -> dict:
    """This rank's index (see the module docstring)."""
    import torch.distributed as dist

    ds = engine.engine
    rank = dist.get_rank()
    coords = engine.topology.coords(rank)
    kind = optimizer_kind(ds.optimizer) if save_optimizer else "none"
    names = {id(p): canonical_param_name(n) for n, p in ds.module.named_parameters()}
    if kind == "flat":
        groups = flat_groups(ds.optimizer)
    elif kind == "zero3":
        groups = ds.optimizer.fp16_groups
    elif kind == "torch":
        groups = [g["params"] for g in ds.optimizer.param_groups]
    else:
        groups = []
    return {"format": INDEX_FORMAT, "rank": rank, "pipe": coords.pipe, "data": coords.data,
            "model": coords.model, "tp": engine.topology.tp, "optimizer": kind,
            "model_file": os.path.basename(ds._get_ckpt_name(str(root), tag)),
            "optimizer_file": (os.path.basename(ds._get_zero_ckpt_name(str(root), tag))
                               if kind in ("flat", "zero3") else None),
            "groups": [[[names[id(p)], list(getattr(p, "ds_shape", p.shape))] for p in g]
                       for g in groups]}


def save(checkpoint_dir: Path, index: dict) -> FileRecord:
    path = checkpoint_dir / index_file(index["rank"])
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_bytes(json.dumps(index, indent=1).encode("utf-8"), path)


def load_all(checkpoint_dir: Path, file_names) -> list[dict]:
    """Every rank's index found among `file_names` (the manifest's files)."""
    prefix = INDEX_DIR + "/"
    return [json.loads((checkpoint_dir / n).read_text(encoding="utf-8"))
            for n in sorted(file_names) if n.startswith(prefix) and n.endswith(".json")]
