"""A15 for Mamba layers (attention_config type `mamba`): the mamba_* keys act on Mamba layers,
and the layout splits them. Each rule names the keys, their values and what to change; the
model (megatron/model/mamba.py) relies on them."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from . import derived as d
from .errors import ConfigError

Config = Mapping[str, Any]
# the mamba_* keys and their GPT-NeoX defaults (which change nothing without Mamba layers)
MAMBA_KEYS = {"mamba_selective_scan_fusion": False, "mamba_causal_conv_fusion": False,
              "mamba_inner_func_fusion": False, "mamba_selective_fp32_params": True,
              "mamba_use_bias_in_conv": True, "mamba_use_bias_in_linears": False}


def mamba_rules(c: Config, world_size: int | None) -> Iterator[str]:
    try:
        types = d.expand_attention_types(c["attention_config"], c["num_layers"])
    except (ConfigError, ValueError, TypeError):
        return  # reported by the attention_config rule
    if "mamba" not in types:
        for key, neutral in MAMBA_KEYS.items():
            if c[key] != neutral:
                yield (f"{key} is {c[key]!r} but attention_config has no mamba layers, so it "
                       f"acts on nothing: add mamba layers to attention_config (e.g. "
                       f"[[[\"mamba\"], {c['num_layers']}]]) or remove {key}.")
        return
    channels = d.mamba_inner_size(c["hidden_size"], c["intermediate_size"])
    tp = c["model_parallel_size"]
    if tp >= 1 and channels % tp:
        yield (f"Mamba layers have {channels} channels (intermediate_size, else 2 * hidden_size) "
               f"but model_parallel_size is {tp}: the channels must divide over the "
               "tensor-parallel ranks; change intermediate_size or model_parallel_size.")
    if c["sequence_parallel"]:
        yield ("sequence_parallel with mamba layers is not implemented (the scan runs along the "
               "whole sequence on every tensor-parallel rank); set sequence_parallel: false.")
    if c["moe_num_experts"] > 1:
        yield ("moe_num_experts > 1 with mamba layers is not implemented (Mamba layers have no "
               "MLP to replace); use one or the other.")
    if (c["zero_optimization"] or {}).get("stage", 0) == 3:
        yield ("zero_optimization.stage 3 with mamba layers is refused, as GPT-NeoX refuses it; "
               "use stage 0, 1 or 2.")
