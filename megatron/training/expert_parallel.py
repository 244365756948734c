"""Expert parallelism (moe_expert_parallel_size > 1) and DeepSpeed: the gradient reduction,
optimizer partitions, gradient norm and checkpoint files of the expert weights.

Each rank holds E / (tp ep) experts per MoE layer (megatron/model/moe.py); the ep ranks of an
expert-parallel group hold different experts, the dp / ep ranks of an expert-data-parallel
group the same ones (megatron/mpu/topology.py). The experts' gradients are summed over the
expert-data-parallel group and divided by the whole data-parallel size: each expert's
gradient already holds the tokens of its ep ranks, so this is the mean over every replica's
tokens, what one process would compute.

DeepSpeed 0.19 does that reduction, and partitions the experts' optimizer state (ZeRO 1/2, its
bf16 optimizer) over the expert-data-parallel group, for parameters flagged `allreduce=False`
with a `group_name` it finds in its own group registry, in optimizer parameter groups marked
`moe`, once its engine has seen a module of its MoE class. `prepare` sets all of that up
before `deepspeed.initialize`: our groups go into its registry under its name for them
(`ep_size_<ep>`), and an empty `_DeepSpeedMoEMarker` stands for the MoE layers, which stay ours.

Checkpoints: megatron/checkpointing/expert_files.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.mpu.groups import ProcessGroups


def group_name(ep: int) -> str:
    """DeepSpeed's registry name for expert-parallel groups of size ep."""
    return f"ep_size_{ep}"


def expert_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters that differ over the expert-parallel group."""
    return [p for p in module.parameters() if getattr(p, "expert_parallel", False)]


def prepare(model: torch.nn.Module, groups: ProcessGroups, num_experts: int) -> str:
    """Register the groups with DeepSpeed and flag the expert parameters and the model for it
    (see the module docstring). Returns the group name the optimizer groups must carry."""
    from deepspeed.utils import groups as ds_groups

    topology, rank = groups.topology, groups.rank
    name = group_name(topology.ep)
    ds_groups._EXPERT_PARALLEL_GROUP[name] = groups.ep_group
    ds_groups._EXPERT_PARALLEL_GROUP_RANKS[name] = topology.expert_parallel_group(rank)
    ds_groups._EXPERT_DATA_PARALLEL_GROUP[name] = groups.edp_group
    ds_groups._EXPERT_DATA_PARALLEL_GROUP_RANKS[name] = topology.expert_data_parallel_group(rank)
    experts = expert_parameters(model)
    for p in experts:
        p.allreduce = False  # deepspeed.moe.utils.is_moe_param
        p.group_name = name
    if experts:  # (a pipeline stage may hold no MoE layer)
        model.add_module("deepspeed_moe_marker", _marker(num_experts, topology.ep, name))
    return name


def _marker(num_experts: int, ep: int, name: str) -> torch.nn.Module:
    """A parameterless module of DeepSpeed's MoE class: what makes its engine treat the model
    as having MoE layers (`has_moe_layers`)."""
    from deepspeed.moe.layer import MoE as DeepSpeedMoE

    class _DeepSpeedMoEMarker(DeepSpeedMoE):
        def __init__(self):
            torch.nn.Module.__init__(self)  # none of DeepSpeed's layer: ours does the work
            self.num_experts, self.ep_size, self.expert_group_name = num_experts, ep, name
            self.num_local_experts = 0  # its per-expert checkpoint files are not used

        def set_deepspeed_parallelism(self, use_data_before_expert_parallel_=False):
            pass  # the groups are ours, registered by `prepare`

        def forward(self, *args, **kwargs):
            raise RuntimeError("the DeepSpeed MoE marker is not a layer")

    return _DeepSpeedMoEMarker()


def expert_norm_squared(params, ep_group) -> torch.Tensor:
    """Sum of squares of the expert gradients over the expert-parallel group (each tensor rank
    counts its own experts), in fp64."""
    grads = [p.grad.detach() for p in params
             if p.grad is not None and getattr(p, "expert_parallel", False)]
    total = torch.zeros((), dtype=torch.float64)
    if grads:
        total += torch.stack(torch._foreach_norm(grads)).double().pow(2).sum().cpu()
    dist.all_reduce(total, group=ep_group)
    return total
