"""Process groups built once from a `Topology` and passed explicitly (no module globals, A3).

`ProcessGroups.build(topology, timeout)` must be called by every rank, in the same order, after
the default process group is initialised. Layers receive only the `TensorParallel` view they need.
`timeout` is the process-group timeout of the run (`collective_timeout` of
distributed_timeout_minutes); torch's `new_group` does not inherit the default group's, it uses
its own default (30 minutes for gloo).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from megatron.mpu.topology import Topology


@dataclass(frozen=True)
class ExpertParallel:
    """Expert parallelism (moe_expert_parallel_size): the `size` data-parallel ranks of `group`
    each hold their share of every MoE layer's experts and exchange tokens by all-to-all;
    `data_group` holds the ranks with the same experts as this one."""

    group: object | None = None
    rank: int = 0
    size: int = 1
    data_group: object | None = None

    @property
    def enabled(self) -> bool:
        return self.size > 1


NO_EP = ExpertParallel()


@dataclass(frozen=True)
class TensorParallel:
    """What a tensor-parallel layer needs: its group, its rank and size in it, and whether
    activations outside attention/MLP are split along the sequence (sequence parallelism)."""

    group: object | None = None
    rank: int = 0
    size: int = 1
    sequence_parallel: bool = False
    rng: object | None = None  # TensorParallelRNG for dropout in split regions
    ep: ExpertParallel = NO_EP  # MoE layers' expert-parallel group (a data-parallel subgroup)
    fp32_reduce: bool = False  # fp32_allreduce: bf16/fp16 sums over the group run in fp32

    @property
    def enabled(self) -> bool:
        return self.size > 1

    def split_region_rng(self):
        """Context for random ops on data that differs across ranks (own heads, own tokens)."""
        import contextlib

        return self.rng.fork() if (self.enabled and self.rng is not None) else contextlib.nullcontext()


NO_TP = TensorParallel()

# The one piece of process state: the layout this process's groups were built for, so that a
# second build with other degrees fails instead of mixing two layouts (A3). The groups
# themselves are never looked up globally; they are passed explicitly.
_BUILT_FOR: dict[str, Topology] = {}


@dataclass(frozen=True)
class ProcessGroups:
    """The groups of this rank: tensor (model) parallel, data parallel, pipeline."""

    topology: Topology
    rank: int
    tp_group: object
    dp_group: object
    pp_group: object
    ep_group: object | None = None  # expert parallelism (ep > 1): token exchange
    edp_group: object | None = None  # ... and the ranks holding the same experts

    @classmethod
    def build(cls, topology: Topology, timeout: timedelta | None = None) -> "ProcessGroups":
        if not dist.is_initialized():
            raise RuntimeError("process groups were requested before torch.distributed was "
                               "initialised: call megatron.mpu.initialize.init_distributed first")
        if dist.get_world_size() != topology.world_size:
            raise RuntimeError(f"topology tp({topology.tp}) * pp({topology.pp}) * dp({topology.dp}) "
                               f"= {topology.world_size} != world_size({dist.get_world_size()})")
        built = _BUILT_FOR.get("topology")
        if built is not None and built != topology:
            raise RuntimeError(f"process groups were already built for {built.describe()}; "
                               f"building them again for {topology.describe()} in the same "
                               "process would mix two layouts: start a new process for a "
                               "different layout")
        rank = dist.get_rank()
        mine = {}
        # every rank creates every group, in one global order, as torch.distributed requires
        kinds = [("tp", topology.model_parallel_group), ("dp", topology.data_parallel_group),
                 ("pp", topology.pipeline_group)]
        if topology.ep > 1:
            kinds += [("ep", topology.expert_parallel_group),
                      ("edp", topology.expert_data_parallel_group)]
        for kind, members_of in kinds:
            seen = set()
            for r in range(topology.world_size):
                members = tuple(members_of(r))
                if members in seen:
                    continue
                seen.add(members)
                group = dist.new_group(list(members), timeout=timeout)
                if rank in members:
                    mine[kind] = group
        _BUILT_FOR["topology"] = topology
        return cls(topology=topology, rank=rank, tp_group=mine["tp"], dp_group=mine["dp"],
                   pp_group=mine["pp"], ep_group=mine.get("ep"), edp_group=mine.get("edp"))

    def tensor_parallel(self, seed: int, sequence_parallel: bool = False,
                        fp32_reduce: bool = False) -> TensorParallel:
        """The view tensor-parallel layers take; one RNG stream per rank for split regions;
        `fp32_reduce` (GPT-NeoX's fp32_allreduce) sums bf16/fp16 tensors over it in fp32."""
        from megatron.mpu.random import TensorParallelRNG

        c = self.topology.coords(self.rank)
        ep = NO_EP if self.topology.ep == 1 else ExpertParallel(
            group=self.ep_group, rank=c.expert, size=self.topology.ep, data_group=self.edp_group)
        return TensorParallel(group=self.tp_group, rank=c.model, size=self.topology.tp,
                              sequence_parallel=sequence_parallel and self.topology.tp > 1,
                              rng=TensorParallelRNG(seed, c.model), ep=ep,
                              fp32_reduce=fp32_reduce)
