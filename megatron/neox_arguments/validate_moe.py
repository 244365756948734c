"""A15 for mixture-of-experts layers: the moe_* keys agree with each other and with the layout.

Each rule names the keys, their values and what to change (a rule about one value yields a
`BadValue` at its key); the model (megatron/model/moe.py) relies on them.
"""

from __future__ import annotations

from typing import Any, Mapping

from . import derived as d
from .errors import BadValue, Problems

Config = Mapping[str, Any]
# keys that only mean something in a model with experts, and their values that change nothing
MOE_ONLY = {"moe_top_k": 1, "moe_router_type": "sinkhorn", "moe_normalize_topk": False,
            "moe_jitter_eps": None, "moe_lbl_in_fp32": False, "moe_aux_loss_coeff": 0.0,
            "moe_z_loss_coeff": 0.0, "moe_expert_interval": 1}


def moe_rules(c: Config, world_size: int | None) -> Problems:
    experts, ep = c["moe_num_experts"], c["moe_expert_parallel_size"]
    if experts is None or experts < 1:
        yield BadValue("moe_num_experts",
                       f"moe_num_experts({experts}) must be at least 1 (1: no experts).")
        return
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1:
        yield BadValue("moe_expert_parallel_size",
                       f"moe_expert_parallel_size({ep!r}) must be a whole number, at least 1.")
        return
    if experts == 1 and ep != 1:
        yield (f"moe_expert_parallel_size is {ep} but moe_num_experts is 1: there are no "
               "experts to split over ranks; set moe_num_experts above 1 or remove "
               "moe_expert_parallel_size.")
    if experts == 1:
        for key, neutral in MOE_ONLY.items():
            if c[key] != neutral:
                yield (f"{key} is {c[key]!r} but moe_num_experts is 1, so the model has no "
                       f"expert layers for it to act on: set moe_num_experts above 1 or remove "
                       f"{key}.")
        return
    yield from _routing(c, experts)
    yield from _layout(c, experts)
    if ep > 1:
        yield from _expert_parallel(c, experts, ep, world_size)


def _routing(c: Config, experts: int) -> Problems:
    if c["moe_expert_interval"] < 1:
        yield BadValue("moe_expert_interval",
                       f"moe_expert_interval({c['moe_expert_interval']}) must be at least 1.")
    if not 1 <= c["moe_top_k"] <= experts:
        yield (f"moe_top_k({c['moe_top_k']}) must be between 1 and moe_num_experts({experts}): "
               "a token cannot go to more experts than there are.")
    if c["moe_normalize_topk"] and c["moe_router_type"] != "topk":
        yield (f"moe_normalize_topk is true but moe_router_type is {c['moe_router_type']}; only "
               "the topk router rescales its weights: set moe_router_type: topk or remove "
               "moe_normalize_topk.")
    eps = c["moe_jitter_eps"]
    if eps is not None and not 0 < eps < 1:
        yield BadValue("moe_jitter_eps",
                       f"moe_jitter_eps({eps}) must be in (0, 1), or null for no jitter.")
    for key in ("moe_aux_loss_coeff", "moe_z_loss_coeff"):
        if c[key] < 0:
            yield BadValue(key, f"{key}({c[key]}) must be 0 or more.")


def _layout(c: Config, experts: int) -> Problems:
    tp = c["model_parallel_size"]
    if tp >= 1 and experts % tp:
        yield (f"moe_num_experts({experts}) % model_parallel_size({tp}) = {experts % tp}; it must "
               "be 0: each tensor-parallel rank holds moe_num_experts / model_parallel_size "
               "whole experts.")
    if c["sequence_parallel"]:
        yield ("sequence_parallel with moe_num_experts > 1 is not implemented: MoE layers route "
               "whole sequences on every tensor-parallel rank; set sequence_parallel: false.")


def _expert_parallel(c: Config, experts: int, ep: int, world_size: int | None) -> Problems:
    tp, pp = c["model_parallel_size"], c["pipe_parallel_size"]
    if tp >= 1 and experts % tp == 0 and (experts // tp) % ep:
        yield (f"moe_num_experts({experts}) / model_parallel_size({tp}) = {experts // tp} "
               f"experts per tensor rank do not split over moe_expert_parallel_size({ep}) "
               "ranks: choose a moe_expert_parallel_size that divides it.")
    world = d.resolve_world_size(c, world_size)
    stages = d.pipeline_stages(pp)
    if world >= 1 and tp >= 1 and pp >= 0 and world % (tp * stages) == 0:
        dp = d.data_parallel_size(world, tp, pp)
        if dp % ep:
            yield (f"moe_expert_parallel_size({ep}) must divide the data-parallel size({dp} = "
                   f"world_size {world} / (model_parallel_size {tp} * pipe_parallel_size "
                   f"{stages})): expert-parallel groups are made of data-parallel ranks.")
    zero = c["zero_optimization"] or {}
    if zero.get("stage", 0) == 3:
        yield ("moe_expert_parallel_size > 1 with zero_optimization.stage 3 is not supported "
               "(DeepSpeed's stage 3 partitions every parameter over all data-parallel ranks, "
               "experts included): use stage 0, 1 or 2, or moe_expert_parallel_size 1.")
    if zero.get("stage", 0) == 2:
        for key in ("contiguous_gradients", "reduce_scatter"):
            if zero.get(key) is False:
                yield (f"zero_optimization.{key}: false with moe_expert_parallel_size > 1: "
                       f"DeepSpeed's stage 2 reduces expert gradients only with {key} on; "
                       f"remove {key} or set it to true.")
