"""Which parameters each rank's files hold, and in what order: what resharding reads.

Every rank writes `shards/rank_<r>.json` into each checkpoint:

    {"format": 1, "rank": 3, "pipe": 1, "data": 1, "model": 0, "tp": 2,
     "optimizer": "flat",                          # a layout of optimizer_layouts.py
     "state_keys": ["exp_avg", "exp_avg_sq"],      # per-parameter state the optimizer keeps
     "model_file": "mp_rank_01_model_states.pt",    # LR schedule, counters (and "torch" state)
     "optimizer_file": "zero_pp_rank_1_mp_rank_01_optim_states.pt",   # "flat", "zero3"
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
Indexes written before "state_keys" existed are Adam's (`ADAM_STATE`).

With expert parallelism (expert_files.py) an index also holds "ep", its "expert" rank and
"expert_groups" (the optimizer groups holding expert weights, partitioned over the ranks of
the same expert rank only); where the optimizer state lives in the model file, the expert
ranks q > 0 name their own copy in "optimizer_file".
"""

from __future__ import annotations

import json
from pathlib import Path

from megatron.checkpointing import expert_files, optimizer_layouts
from megatron.checkpointing.durable import FileRecord, write_bytes
from megatron.model.partition import canonical_param_name

INDEX_FORMAT = 1
INDEX_DIR = "shards"
ADAM_STATE = ("exp_avg", "exp_avg_sq")


def index_file(rank: int) -> str:
    """Path of global rank `rank`'s index, relative to the checkpoint directory."""
    return f"{INDEX_DIR}/rank_{rank}.json"


def state_keys(index: dict) -> tuple[str, ...]:
    """The per-parameter optimizer state tensors the saving run's optimizer declared."""
    return tuple(index.get("state_keys", ADAM_STATE))


def describe(engine, root: Path, tag: str, save_optimizer: bool) -> dict:
    """This rank's index (see the module docstring)."""
    import torch.distributed as dist

    ds = engine.engine
    rank = dist.get_rank()
    coords = engine.topology.coords(rank)
    layout = optimizer_layouts.detect(ds.optimizer if save_optimizer else None)
    names = {id(p): canonical_param_name(n) for n, p in ds.module.named_parameters()}
    groups = layout.groups(ds.optimizer)
    index = {"format": INDEX_FORMAT, "rank": rank, "pipe": coords.pipe, "data": coords.data,
             "model": coords.model, "tp": engine.topology.tp, "optimizer": layout.name,
             "state_keys": list(engine.run.optimizer_state),
             "model_file": optimizer_layouts.model_file_name(ds, root, tag),
             "optimizer_file": (optimizer_layouts.optimizer_file_name(ds, root, tag)
                                if layout.name in ("flat", "zero3") else None),
             "groups": [[[names[id(p)], list(optimizer_layouts.full_shape(p))] for p in g]
                        for g in groups]}
    if engine.topology.ep > 1:  # expert parallelism (expert_files.py)
        index.update(ep=engine.topology.ep, expert=coords.expert,
                     expert_groups=[g for g, params in enumerate(groups)
                                    if params and getattr(params[0], "expert_parallel", False)])
        extra = expert_files.extra_optimizer_file(engine) if save_optimizer else None
        if extra is not None:
            index["optimizer_file"] = extra
    return index


def save(checkpoint_dir: Path, index: dict) -> FileRecord:
    path = checkpoint_dir / index_file(index["rank"])
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_bytes(json.dumps(index, indent=1).encode("utf-8"), path)


def load_all(checkpoint_dir: Path, file_names) -> list[dict]:
    """Every rank's index found among `file_names` (the manifest's files)."""
    prefix = INDEX_DIR + "/"
    return [json.loads((checkpoint_dir / n).read_text(encoding="utf-8"))
            for n in sorted(file_names) if n.startswith(prefix) and n.endswith(".json")]
