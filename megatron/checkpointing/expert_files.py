"""Checkpoints of runs with expert parallelism (moe_expert_parallel_size > 1).

They keep the files of a run without it:
- the model files hold each tensor rank's experts whole, gathered over the expert-parallel
  group while DeepSpeed saves (`checkpoint_view`), so that generation, eval, export and
  resharding read them as from any checkpoint;
- the optimizer state stays per rank: ZeRO 1/2 and the bf16 optimizer partition the experts'
  state over the ranks holding the same experts, and where the state lives in the model file
  (which only data-parallel rank 0 writes), the ranks of expert rank q > 0 among the first ep
  data-parallel ranks write theirs to `expert_optim_states_*.pt` (`extra_optimizer_file`);
  each rank's shard index records its expert rank and which optimizer groups hold experts
  (shard_index.py), which is what reading the state back needs (weights.py);
- loading into a run with expert parallelism, or from such a checkpoint, goes through the
  layout-free path (reshard.py), the same layout included (load.py).
DeepSpeed's own MoE checkpoint path (one file per expert) is turned off for the save.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.distributed as dist

from megatron.checkpointing import optimizer_layouts
from megatron.model.moe import Experts


@contextlib.contextmanager
def checkpoint_view(engine):
    """While DeepSpeed saves: its engine without its MoE checkpoint path (our files keep the
    layout of a run without expert parallelism), and each rank's experts gathered over the
    expert-parallel group into what its model file holds. Collective."""
    ds, ep = engine.engine, engine.tp.ep
    if not ep.enabled:
        yield
        return
    gathered = {}
    experts = [m for m in ds.module.modules() if isinstance(m, Experts)]
    for module in experts:
        for p in (module.w_in, module.w_out):
            parts = [torch.empty_like(p.data) for _ in range(ep.size)]
            dist.all_gather(parts, p.data.contiguous(), group=ep.group)
            gathered[id(p)] = torch.cat(parts)
    hooks = [m.register_state_dict_post_hook(_whole_experts(gathered)) for m in experts]
    saved, ds.has_moe_layers = ds.has_moe_layers, False
    try:
        yield
    finally:
        ds.has_moe_layers = saved
        for h in hooks:
            h.remove()


def _whole_experts(gathered: dict):
    def hook(module, state_dict, prefix, local_metadata):
        for pname in ("w_in", "w_out"):
            key = prefix + pname
            p = getattr(module, pname)
            if key in state_dict and id(p) in gathered:
                state_dict[key] = gathered[id(p)]
    return hook


def extra_optimizer_file(engine) -> str | None:
    """The file that holds this rank's optimizer state besides DeepSpeed's, or None: ranks of
    expert rank q > 0 (and expert-data-parallel rank 0) when the optimizer state lives in the
    model file, which only data-parallel rank 0 writes."""
    ds, topology = engine.engine, engine.topology
    if topology.ep == 1 or ds.optimizer is None or optimizer_layouts.partitioned(ds.optimizer):
        return None
    c = topology.coords(dist.get_rank())
    if c.data == 0 or c.data >= topology.ep:
        return None
    return f"expert_optim_states_ep{c.data:02d}_pp{c.pipe:02d}_mp{c.model:02d}.pt"


def save_extra_optimizer_state(engine, directory: Path) -> str | None:
    """Write `extra_optimizer_file` through the engine's checkpoint engine (recorded for the
    manifest); its name or None."""
    name = extra_optimizer_file(engine)
    if name is not None:
        ds = engine.engine
        ds.checkpoint_engine.save({"optimizer": ds.optimizer.state_dict()}, str(directory / name))
    return name
