"""A15 for mixture-of-experts layers: the moe_* keys agree with each other and with the layout.

Each rule names the keys, their values and what to change; the model (megatron/model/moe.py)
relies on them.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

Config = Mapping[str, Any]
# keys that only mean something in a model with experts, and their values that change nothing
MOE_ONLY = {"moe_top_k": 1, "moe_router_type": "sinkhorn", "moe_normalize_topk": False,
            "moe_jitter_eps": None, "moe_lbl_in_fp32": False, "moe_aux_loss_coeff": 0.0,
            "moe_z_loss_coeff": 0.0, "moe_expert_interval": 1}


def moe_rules(c: Config, world_size: int | None) -> Iterator[str]:
    experts = c["moe_num_experts"]
    if experts is None or experts < 1:
        yield f"moe_num_experts({experts}) must be at least 1 (1: no experts)."
        return
    if experts == 1:
        for key, neutral in MOE_ONLY.items():
            if c[key] != neutral:
                yield (f"{key} is {c[key]!r} but moe_num_experts is 1, so the model has no "
                       f"expert layers for it to act on: set moe_num_experts above 1 or remove "
                       f"{key}.")
        return
    yield from _routing(c, experts)
    yield from _layout(c, experts)


def _routing(c: Config, experts: int) -> Iterator[str]:
    if c["moe_expert_interval"] < 1:
        yield f"moe_expert_interval({c['moe_expert_interval']}) must be at least 1."
    if not 1 <= c["moe_top_k"] <= experts:
        yield (f"moe_top_k({c['moe_top_k']}) must be between 1 and moe_num_experts({experts}): "
               "a token cannot go to more experts than there are.")
    if c["moe_normalize_topk"] and c["moe_router_type"] != "topk":
        yield (f"moe_normalize_topk is true but moe_router_type is {c['moe_router_type']}; only "
               "the topk router rescales its weights: set moe_router_type: topk or remove "
               "moe_normalize_topk.")
    eps = c["moe_jitter_eps"]
    if eps is not None and not 0 < eps < 1:
        yield f"moe_jitter_eps({eps}) must be in (0, 1), or null for no jitter."
    for key in ("moe_aux_loss_coeff", "moe_z_loss_coeff"):
        if c[key] < 0:
            yield f"{key}({c[key]}) must be 0 or more."


def _layout(c: Config, experts: int) -> Iterator[str]:
    tp = c["model_parallel_size"]
    if tp >= 1 and experts % tp:
        yield (f"moe_num_experts({experts}) % model_parallel_size({tp}) = {experts % tp}; it must "
               "be 0: each tensor-parallel rank holds moe_num_experts / model_parallel_size "
               "whole experts.")
    if c["sequence_parallel"]:
        yield ("sequence_parallel with moe_num_experts > 1 is not implemented: MoE layers route "
               "whole sequences on every tensor-parallel rank; set sequence_parallel: false.")
