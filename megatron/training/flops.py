"""Parameter count, training FLOPs per token and model FLOPs utilisation (MFU) from the model
config and the measured throughput."""

from __future__ import annotations

from megatron.model.config import GATED
from megatron.model.config import ModelConfig
from megatron.model.param_count import count_parameters  # noqa: F401  (re-exported)


def _mamba_matmul_params(config: ModelConfig) -> int:
    """A Mamba layer's projections (in, x, dt, out), counted like weights; plus the scan's
    work per token as weight-equivalents: per channel and state element, the state update and
    the output product (~3 multiply-adds), and the convolution's taps."""
    from megatron.model.config import CONV_WIDTH, STATE_SIZE, dt_rank

    h, c, r = config.hidden_size, config.mamba_inner_size, dt_rank(config.hidden_size)
    projections = 2 * c * h + (r + 2 * STATE_SIZE) * c + r * c + c * h
    return projections + 3 * c * STATE_SIZE + c * CONV_WIDTH


def _matmul_params_per_layer(config: ModelConfig, layer_number: int) -> int:
    """Weights a token multiplies in one layer: attention, and the MLP, or in an MoE layer the
    router and moe_top_k experts (the active parameters)."""
    h, d = config.hidden_size, config.head_dim
    if config.is_mamba_layer(layer_number):
        return _mamba_matmul_params(config)
    qkv = h * (config.num_attention_heads + 2 * config.num_kv_heads) * d
    dense = config.num_attention_heads * d * h
    up = config.intermediate_size * (2 if config.activation in GATED else 1)
    mlp = h * up + config.intermediate_size * h
    if config.is_moe_layer(layer_number):
        mlp = config.moe_num_experts * h + config.moe_top_k * mlp
    return qkv + dense + mlp


def flops_per_token(config: ModelConfig, seq_length: int | None = None) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), counting matmuls only.

    Forward: 2 FLOPs per weight of every linear layer a token passes through (in MoE layers
    the router and its moe_top_k experts) and the LM head, plus attention's two
    [s x s] products, 2 * 2 * s * (heads * head_dim) per layer (full, not causal-halved, as in
    the usual MFU convention of PaLM and Megatron); in Mamba layers their projections and the
    scan (`_mamba_matmul_params`).
    """
    s = seq_length or config.seq_length
    attn_width = config.num_attention_heads * config.head_dim
    layers = sum(_matmul_params_per_layer(config, i) for i in range(config.num_layers))
    attention_layers = sum(not config.is_mamba_layer(i) for i in range(config.num_layers))
    forward = (2 * layers
               + 2 * config.padded_vocab_size * config.hidden_size
               + attention_layers * 4 * s * attn_width)
    return 3.0 * forward


def model_tflops_per_device(flops_per_token: float, tokens_per_sec: float,
                            world_size: int) -> float:
    """Model TFLOP/s achieved per device: the training FLOPs of the tokens processed per second
    (`flops_per_token`, recomputation not counted), shared by all `world_size` devices."""
    return flops_per_token * tokens_per_sec / world_size / 1e12


def mfu_percent(tflops_per_device: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation in percent (GPT-NeoX's unit): achieved model TFLOP/s per device
    over the device's peak."""
    return 100.0 * tflops_per_device / peak_tflops
