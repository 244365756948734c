"""The model section: shape, positional embedding, norm, activation, init and fused-kernel flags."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option


@dataclass(frozen=True)
class ModelArgs:
    """What the network looks like; blocks receive this section and nothing else of the config."""

    num_layers: int | None = option(None, "Number of transformer layers (required).")
    hidden_size: int | None = option(None, "Width of the residual stream (required).")
    num_attention_heads: int | None = option(
        None, "Number of attention (query) heads (required); must divide hidden_size."
    )
    num_kv_heads: int | None = option(
        None,
        "Key/value heads for grouped-query attention; null gives one per query head "
        "(multi-head attention), 1 gives multi-query attention.",
    )
    intermediate_size: int | None = option(
        None,
        "MLP size; null means 4 * hidden_size. Gated activations (geglu, swiglu, reglu) "
        "follow GPT-NeoX: width int(size * 2 / 3) // 2; see args.derived.intermediate_size.",
    )
    mlp_multiple_of: int = option(1, "Round the MLP width up to a multiple of this.")
    seq_length: int | None = option(None, "Training sequence length in tokens (required).")
    max_position_embeddings: int | None = option(
        None, "Longest sequence the model supports (required); at least seq_length."
    )
    pos_emb: str = option(
        "learned", "Positional embedding: learned, rotary, sinusoidal, alibi or none."
    )
    rotary_pct: float = option(
        1.0, "Fraction of each attention head's dimensions that rotary embedding rotates."
    )
    rotary_emb_base: int = option(10000, "Base (theta) of the rotary embedding frequencies.")
    norm: str = option("layernorm", "Normalisation layer: layernorm, rmsnorm or scalenorm.")
    layernorm_epsilon: float = option(1.0e-5, "Epsilon of layernorm.")
    rms_norm_epsilon: float = option(1.0e-8, "Epsilon of rmsnorm.")
    scalenorm_epsilon: float = option(1.0e-8, "Epsilon of scalenorm.")
    activation: str = option(
        "gelu", "MLP activation: gelu, relu, silu, or the gated geglu, swiglu, reglu."
    )
    no_weight_tying: bool = option(
        False,
        "Give the output head its own weights instead of reusing the input embedding "
        "(false: the head is the embedding, as in GPT-NeoX).",
    )
    gpt_j_residual: bool = option(
        False,
        "Parallel residual as in GPT-J: x + attn(ln1(x)) + mlp(ln2(x)) instead of two "
        "sequential residual blocks.",
    )
    gpt_j_tied: bool = option(
        False, "With gpt_j_residual, share one layer norm between the attention and MLP branches."
    )
    use_bias_in_norms: bool | None = option(
        None,
        "Give norm layers a bias (shift) parameter. Unset: as GPT-NeoX builds its norms (it "
        "never reads this key): layernorm with a bias, rmsnorm and scalenorm without.",
    )
    use_bias_in_attn_linear: bool = option(
        True, "Give the attention projections (QKV and output) bias terms."
    )
    use_bias_in_mlp: bool = option(True, "Give the MLP projections bias terms.")
    hidden_dropout: float = option(0.0, "Dropout probability on the outputs of attention and MLP.")
    attention_dropout: float = option(0.0, "Dropout probability on the attention weights.")
    init_method: str = option(
        "normal",
        "Init of all weights except residual-output projections: normal, scaled_normal, "
        "single_residual_scaled_normal, orthogonal (gain sqrt(2)), scaled_orthogonal (gain "
        "sqrt(2 / num_layers)), xavier_uniform, xavier_normal, wang_init, small_init.",
    )
    output_layer_init_method: str = option(
        "scaled_normal",
        "Init of the projections that write into the residual stream "
        "(same choices as init_method).",
    )
    init_method_std: float = option(
        0.02, "Standard deviation of the normal and scaled_normal initialisations."
    )
    attention_config: list | None = option(
        None,
        'Attention type per layer in GPT-NeoX\'s run-length form, e.g. [[["global", "local"], 6]] '
        "for 12 alternating layers; null means global everywhere. Types: global (torch SDPA), "
        "local (sliding window), flash (flash-attn package).",
    )
    sliding_window_width: int | None = option(
        None, "Window in tokens of local attention layers (required when any layer is local)."
    )
    attention_softmax_in_fp32: bool = option(
        False, "Compute the attention softmax in float32 under fp16/bf16. SDPA and flash-attn "
        "always do (as GPT-NeoX's flash and fused-softmax paths), so false changes nothing here "
        "but the plain attention the tests compare the kernels with."
    )
    output_layer_parallelism: str = option(
        "column",
        "How the output head is split across tensor-parallel ranks; only column (over the "
        "vocabulary) is supported.",
    )
    make_vocab_size_divisible_by: int = option(
        128,
        "Pad the vocabulary to a multiple of this times model_parallel_size "
        "(see padded_vocab_size).",
    )
    scaled_upper_triang_masked_softmax_fusion: bool = option(
        False,
        "GPT-NeoX's fused causal softmax. Attention here always runs through torch "
        "scaled_dot_product_attention, which fuses scale, causal mask and softmax; true only "
        "logs that at startup.",
    )
    scaled_masked_softmax_fusion: bool = option(
        False,
        "GPT-NeoX's fused masked softmax. torch scaled_dot_product_attention always fuses the "
        "mask (document, window, ALiBi) with scale and softmax; true only logs that at startup.",
    )
    bias_gelu_fusion: bool = option(
        False,
        "With activation gelu, GPT-NeoX's fused bias + GELU: GELU's tanh approximation of the "
        "first MLP projection plus its bias, one Triton kernel on GPUs (torch's tanh GELU "
        "elsewhere). The approximation is what the flag means in GPT-NeoX, on every device.",
    )
    bias_dropout_fusion: bool = option(
        False,
        "Residual add and hidden dropout in one Triton kernel on GPUs (eager ops elsewhere); "
        "its dropout mask differs from torch's, drawn from the same generator.",
    )
    rope_fusion: bool = option(
        False,
        "The rotate-half rotary embedding of queries and keys as one Triton kernel on GPUs "
        "(the eager fp32 rotary elsewhere).",
    )
    layernorm_fusion: bool = option(
        False,
        "With norm layernorm, the Triton LayerNorm kernel (forward and backward) on GPUs; "
        "torch.nn.LayerNorm elsewhere.",
    )
    rmsnorm_fusion: bool = option(
        False,
        "With norm rmsnorm, the Triton RMSNorm kernel (forward and backward) on GPUs, torch's "
        "rms_norm op elsewhere, instead of the written-out RMSNorm (same parameters, fp32 math).",
    )
    use_flashattn_swiglu: bool = option(
        False,
        "With activation swiglu, the Triton SwiGLU kernel (forward and backward) on GPUs "
        "instead of flash-attn's; the eager silu(gate) * value elsewhere.",
    )
    torch_compile: bool = option(
        False,
        "Training: each dense transformer layer runs through torch.compile (inductor), which "
        "fuses its elementwise ops and cuts per-op launch cost; inside those layers inductor's "
        "kernels replace the fusion flags' Triton kernels, all but rope_fusion's rotary (the "
        "flags' math, such as bias_gelu_fusion's tanh GELU, stays). MoE and Mamba layers, generation and "
        "evaluation run eager. Not a GPT-NeoX key. See docs/train.md, Compiled layers.",
    )
    cpu_matmul_precision: str = option(
        "auto",
        "bf16/fp16 matrix products on CPU tensors: fp32 multiplies the operands as fp32 and "
        "rounds the result back (what a bf16 kernel computes, faster on some CPUs without "
        "AMX), native uses torch's low-precision kernels, auto times both when the run starts "
        "and takes the faster (native where the CPU has AMX; a resumed run keeps the "
        "checkpoint's choice).",
    )
    mamba_selective_scan_fusion: bool = option(
        False,
        "Mamba layers: the fast selective scan (mamba_ssm's CUDA kernel where installed, else "
        "the chunked torch scan) instead of the step-by-step reference.",
    )
    mamba_causal_conv_fusion: bool = option(
        False,
        "Mamba layers: causal_conv1d's CUDA kernel for the short convolution where installed "
        "(else torch's conv1d, as without it).",
    )
    mamba_inner_func_fusion: bool = option(
        False,
        "Mamba layers: mamba_ssm's fused block (projections, convolution and scan in one "
        "kernel) where installed; else the scan and convolution as the two flags above say.",
    )
    mamba_selective_fp32_params: bool = option(
        True,
        "Mamba layers: A_log and D in fp32 for the scan (see docs/train.md, Mamba, for what "
        "DeepSpeed keeps in bf16/fp16 runs).",
    )
    mamba_use_bias_in_conv: bool = option(True, "Mamba layers: a bias in the convolution.")
    mamba_use_bias_in_linears: bool = option(
        False, "Mamba layers: biases in the input, state (x_proj) and output projections."
    )
    moe_num_experts: int = option(
        1,
        "Experts in each mixture-of-experts layer; 1 (the default) means none: every layer "
        "has a dense MLP.",
    )
    moe_expert_interval: int = option(
        1,
        "With moe_num_experts > 1, transformer layer i (counted from 0) is an MoE layer when "
        "i % moe_expert_interval == 0, as in GPT-NeoX; the others keep a dense MLP.",
    )
    moe_top_k: int = option(1, "Experts each token is sent to in an MoE layer.")
    moe_router_type: str = option(
        "sinkhorn",
        "MoE routing: sinkhorn (GPT-NeoX: Sinkhorn-balanced choice in training, top-k at "
        "inference) or topk (top-k of the router's softmax, also in training).",
    )
    moe_normalize_topk: bool = option(
        False,
        "With moe_router_type topk and moe_top_k > 1, rescale each token's k expert weights "
        "to sum to 1 (Mixtral); GPT-NeoX uses the softmax probabilities as they are.",
    )
    moe_jitter_eps: float | None = option(
        None,
        "Multiply the router's input by uniform noise in [1 - eps, 1 + eps] in training; "
        "null: no jitter.",
    )
    moe_lbl_in_fp32: bool = option(
        False, "Compute the MoE load-balancing loss in fp32 rather than in the model's dtype."
    )
    moe_aux_loss_coeff: float = option(
        0.0,
        "Weight of each MoE layer's load-balancing loss in the training loss (Switch "
        "Transformer's, as Mixtral's router_aux_loss_coef); 0, as GPT-NeoX, logs it only.",
    )
    moe_z_loss_coeff: float = option(
        0.0,
        "Weight of each MoE layer's router z-loss (ST-MoE: mean squared logsumexp of the "
        "router logits) in the training loss; 0 logs it only.",
    )
