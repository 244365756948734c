"""How many parameters each layer of the model holds on one rank, computed from the config alone
(and how many elements generation's KV cache holds).

    layer_params(config, tp=2)                  # [embedding, block 0 .. block L-1, final norm, head]
    stage_layers(config, pp=4, method="type:transformer|mlp")   # DeepSpeed's partition
    params_per_rank(config, tp=2, pp=4)         # [stage 0's count, ..., stage 3's count]

The counts follow the layers in `megatron/model/` exactly (tests build the real modules and
compare with sum(p.numel())): the vocabulary (padded), QKV and MLP input rows, and the attention
and MLP output columns are split over tensor-parallel ranks; norms, the output projections'
biases and learned position embeddings are whole on every rank. With tied embeddings the LM
head is the embedding layer again: built once when the embedding and head share a stage (or
without a pipeline), and once on each of the first and last stages otherwise, as DeepSpeed's
PipelineModule builds its tied layers.
"""

from __future__ import annotations

import re

from megatron.model.config import CONV_WIDTH, GATED, STATE_SIZE, dt_rank

# class names of the layer specs (megatron/model/gpt.py build_layer_specs), which DeepSpeed's
# "type:<regex>" partition method matches
EMBEDDING, BLOCK, FINAL_NORM, HEAD = "EmbeddingPipe", "TransformerLayerPipe", "FinalNormPipe", "LMHead"
MAMBA = "MambaLayerPipe"
VALUE_HEAD = "ValueHead"


def norm_params(config) -> int:
    """One norm layer over the hidden size (megatron/model/norms.py)."""
    if config.norm == "scalenorm":
        return 1  # one learned scalar
    return config.hidden_size * (2 if config.use_bias_in_norms else 1)


def embedding_params(config, tp: int = 1) -> int:
    """The vocabulary rows of this rank, plus learned position embeddings (not split)."""
    count = config.padded_vocab_size // tp * config.hidden_size
    if config.pos_emb == "learned":
        count += config.max_position_embeddings * config.hidden_size
    return count


def expert_params(config) -> int:
    """One expert of an MoE layer: the MLP's two matrices without biases."""
    up = config.intermediate_size * (2 if config.activation in GATED else 1)
    return (up + config.intermediate_size) * config.hidden_size


def mlp_params(config, tp: int = 1, moe: bool = False, ep: int = 1) -> int:
    """The feed-forward part of a layer on a rank of `tp`: the dense MLP, or with `moe` the
    router (whole on every rank) and moe_num_experts / (tp * ep) experts (ep: the expert-
    parallel size)."""
    h = config.hidden_size
    if moe:
        experts = config.moe_num_experts
        return experts * h + experts // (tp * ep) * expert_params(config)
    up_rows = config.intermediate_size * (2 if config.activation in GATED else 1) // tp
    count = up_rows * h + h * (config.intermediate_size // tp)
    return count + (up_rows + h if config.use_bias_in_mlp else 0)


def mamba_params(config, tp: int = 1) -> int:
    """One Mamba layer on a rank of `tp`: its norm and mixer (megatron/model/mamba.py)."""
    h, d, n = config.hidden_size, config.mamba_inner_size // tp, STATE_SIZE
    r = dt_rank(h)
    count = 2 * d * h + d * CONV_WIDTH + (r + 2 * n) * d + d * r + d + d * n + d + h * d
    if config.mamba_use_bias_in_conv:
        count += d
    if config.mamba_use_bias_in_linears:
        count += 2 * d + (r + 2 * n) + h  # in_proj (split), x_proj and out_proj (whole)
    return norm_params(config) + count


def block_params(config, tp: int = 1, moe: bool = False, ep: int = 1) -> int:
    """One transformer layer on a rank of `tp`: two norms, attention, MLP (or MoE)."""
    h, d = config.hidden_size, config.head_dim
    qkv_rows = (config.num_attention_heads + 2 * config.num_kv_heads) * d // tp
    attn_cols = config.num_attention_heads * d // tp
    count = 2 * norm_params(config) + qkv_rows * h + h * attn_cols + mlp_params(config, tp, moe, ep)
    if config.use_bias_in_attn_linear:
        count += qkv_rows + h  # the dense (row-parallel) bias is whole on every rank
    return count


def layer_kinds(config) -> list[str]:
    """The class name of each layer spec, in pipeline order."""
    head = VALUE_HEAD if getattr(config, "value_head", False) else (
        EMBEDDING if config.tied_embeddings else HEAD)
    blocks = [MAMBA if config.is_mamba_layer(i) else BLOCK for i in range(config.num_layers)]
    return [EMBEDDING, *blocks, FINAL_NORM, head]


def layer_params(config, tp: int = 1, ep: int = 1) -> list[int]:
    """Parameters each layer spec builds on a rank of `tp` (a tied head counts in full, as
    DeepSpeed's "parameters" partition method counts it)."""
    per_kind = {EMBEDDING: embedding_params(config, tp), FINAL_NORM: norm_params(config),
                HEAD: config.padded_vocab_size // tp * config.hidden_size,
                VALUE_HEAD: config.hidden_size}
    blocks = [mamba_params(config, tp) if config.is_mamba_layer(i)
              else block_params(config, tp, config.is_moe_layer(i), ep)
              for i in range(config.num_layers)]
    kinds = layer_kinds(config)
    return [per_kind[kinds[0]], *blocks, *[per_kind[kind] for kind in kinds[-2:]]]


def stage_layers(config, pp: int, method: str = "type:transformer|mlp", tp: int = 1,
                 ep: int = 1) -> list[range]:
    """The layer-spec indices of each of `pp` pipeline stages, as DeepSpeed's PipelineModule
    partitions them (uniform, parameters or type:<regex>)."""
    kinds = layer_kinds(config)
    if pp <= 1:
        return [range(len(kinds))]
    name = method.lower()
    if name == "uniform":
        parts = uniform_bounds(len(kinds), pp)
    elif name == "parameters":
        parts = balanced_bounds(layer_params(config, tp, ep), pp)
    elif name.startswith("type:"):
        pattern = re.compile(name.split(":", 1)[1], re.IGNORECASE)
        weights = [1 if pattern.search(kind) else 0 for kind in kinds]
        if not any(weights):
            raise ValueError(f"pipe_partition_method {method!r} matches no layer; layer types "
                             f"are {', '.join(sorted(set(kinds)))}")
        parts = balanced_bounds(weights, pp)
    else:
        raise ValueError(f"pipe_partition_method {method!r} is not known; valid: uniform, "
                         "parameters, type:<regex>")
    return [range(parts[s], parts[s + 1]) for s in range(pp)]


def uniform_bounds(items: int, parts: int) -> list[int]:
    """Stage boundaries [0, ..., items] for equal counts of items, the first `items % parts`
    stages holding one more (DeepSpeed's `partition_uniform`; with fewer items than stages,
    one item per stage and the last stages empty)."""
    if items <= parts:
        return [min(p, items) for p in range(parts + 1)]
    size, extra = divmod(items, parts)
    return [p * size + min(p, extra) for p in range(parts + 1)]


def balanced_bounds(weights: list[int], parts: int) -> list[int]:
    """Stage boundaries for contiguous stages of even total weight, as DeepSpeed's
    `partition_balanced` chooses them (a test compares the two): building stage by stage, each
    prefix of the layers keeps the split with the smallest spread between its heaviest and its
    lightest stage, the latest such split on a tie."""
    n = len(weights)
    if n <= parts:
        return uniform_bounds(n, parts)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[j][i]: (spread, heaviest, lightest, start of the last stage) for i layers in j stages;
    # the empty start's lightest is inf, as DeepSpeed's, so that one stage has spread 0
    best = [[(inf, inf, inf, 0)] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = (0.0, 0.0, inf, 0)
    for i in range(1, n + 1):
        for j in range(1, min(i, parts) + 1):
            for start in range(i):
                _, heavy, light, _ = best[j - 1][start]
                stage = prefix[i] - prefix[start]
                top, bottom = max(heavy, stage), min(light, stage)
                if best[j][i][0] >= top - bottom:
                    best[j][i] = (top - bottom, top, bottom, start)
    bounds = [n]
    for j in range(parts, 0, -1):
        bounds.append(best[j][bounds[-1]][3])
    return bounds[::-1]


def params_per_rank(config, tp: int = 1, pp: int = 0, method: str = "type:transformer|mlp",
                    ep: int = 1) -> list[int]:
    """sum(p.numel()) of the model on a rank of each pipeline stage (one entry when pp <= 1)."""
    counts = layer_params(config, tp, ep)
    kinds = layer_kinds(config)
    out = []
    for layers in stage_layers(config, pp, method, tp, ep):
        total = sum(counts[i] for i in layers)
        tied_here = (kinds[-1] == EMBEDDING and 0 in layers and len(kinds) - 1 in layers)
        out.append(total - (counts[-1] if tied_here else 0))  # one module serves both
    return out


def expert_params_per_rank(config, layers, tp: int = 1, ep: int = 1) -> int:
    """The expert weights among `layers` (layer-spec indices of a stage) on a rank."""
    moe = sum(1 for i in layers if 1 <= i <= config.num_layers and config.is_moe_layer(i - 1))
    return moe * (config.moe_num_experts // (tp * ep)) * expert_params(config)


def count_parameters(config) -> int:
    """Every parameter of the full (unsharded) model, tied weights counted once."""
    return params_per_rank(config)[0]


def kv_cache_elements(num_layers: int, batch: int, max_len: int, kv_heads: int,
                      head_dim: int) -> int:
    """Elements of the KV cache (A29): keys and values of every layer for `batch` sequences of
    `max_len` positions, this rank's `kv_heads`."""
    return 2 * num_layers * batch * max_len * kv_heads * head_dim
