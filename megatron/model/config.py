"""The resolved model shape: everything the model's layers read, and nothing else.

`ModelConfig` is built once from the run config (`model_config_from_args`) so blocks never see the
whole run config, only this frozen section with derived values (padded vocab, kv heads, FFN size,
per-layer attention types) already resolved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from megatron.host import fp32_products
from megatron.neox_arguments.registries import GATED_ACTIVATIONS

# activations whose MLP up-projection is two matrices, one gating the other (activations.py);
# imported from here, without torch, by the counts deepy.py makes before any worker starts
GATED = frozenset(GATED_ACTIVATIONS)

# a Mamba layer's fixed sizes (megatron/model/mamba.py), here for the same counts
STATE_SIZE = 16  # n: GPT-NeoX's d_state
CONV_WIDTH = 4  # GPT-NeoX's d_conv


def dt_rank(hidden_size: int) -> int:
    """Rank of a Mamba layer's time-step projection: GPT-NeoX's ceil(hidden_size / 16)."""
    return math.ceil(hidden_size / 16)


@dataclass(frozen=True)
class ModelConfig:
    """The model's shape and architecture choices, fully resolved."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    intermediate_size: int
    seq_length: int
    max_position_embeddings: int
    padded_vocab_size: int
    pos_emb: str = "rotary"
    rotary_pct: float = 1.0
    rotary_emb_base: float = 10000.0
    norm: str = "layernorm"
    norm_epsilon: float = 1e-5
    activation: str = "gelu"
    tied_embeddings: bool = False
    gpt_j_residual: bool = False
    gpt_j_tied: bool = False
    use_bias_in_norms: bool = True
    use_bias_in_attn_linear: bool = True
    use_bias_in_mlp: bool = True
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    init_method: str = "normal"
    output_layer_init_method: str = "scaled_normal"
    init_method_std: float = 0.02
    attention_types: tuple[str, ...] = field(default_factory=tuple)
    sliding_window_width: int | None = None
    attention_softmax_in_fp32: bool = False
    rmsnorm_fusion: bool = False
    layernorm_fusion: bool = False
    rope_fusion: bool = False
    bias_gelu_fusion: bool = False  # GELU's tanh approximation (GPT-NeoX's meaning of the flag)
    bias_dropout_fusion: bool = False
    use_flashattn_swiglu: bool = False
    cpu_matmul_precision: str = "auto"  # bf16/fp16 products on CPU tensors (mpu/products.py)
    mamba_inner_size: int = 0  # channels of Mamba layers (megatron/model/mamba.py)
    mamba_selective_scan_fusion: bool = False
    mamba_causal_conv_fusion: bool = False
    mamba_inner_func_fusion: bool = False
    mamba_selective_fp32_params: bool = True
    mamba_use_bias_in_conv: bool = True
    mamba_use_bias_in_linears: bool = False
    moe_num_experts: int = 1  # 1: every layer has a dense MLP (megatron/model/moe.py)
    moe_expert_interval: int = 1
    moe_top_k: int = 1
    moe_router_type: str = "sinkhorn"
    moe_normalize_topk: bool = False
    moe_jitter_eps: float | None = None
    moe_lbl_in_fp32: bool = False
    moe_aux_loss_coeff: float = 0.0
    moe_z_loss_coeff: float = 0.0
    seed: int = 1234
    value_head: bool = False  # a reward model: a value head in place of the LM head

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def fp32_products(self) -> bool:
        """Whether bf16/fp16 products on CPU tensors run in fp32 (megatron/mpu/products.py)."""
        return fp32_products(self.cpu_matmul_precision)

    @property
    def gelu_approximation(self) -> str:
        """'tanh' where the activation is GPT-NeoX's bias_gelu_fusion GELU, else 'none'."""
        return "tanh" if self.activation == "gelu" and self.bias_gelu_fusion else "none"

    @property
    def layer_attention(self) -> tuple:
        """What each layer's token mixing computes: 'mamba', or how many keys a query sees
        (None: every earlier one). attention_config kinds that compute the same compare equal:
        `global` and `flash` (flash-attn or SDPA computing the same attention), and a window
        given either way (`attention_window`)."""
        kinds = self.attention_types or ("global",) * self.num_layers
        return tuple("mamba" if kind == "mamba" else attention_window(kind,
                                                                      self.sliding_window_width)
                     for kind in kinds)

    def is_moe_layer(self, layer_number: int) -> bool:
        """Whether transformer layer `layer_number` (0-based) has experts in place of its MLP:
        GPT-NeoX's rule, every layer whose number is a multiple of moe_expert_interval."""
        return self.moe_num_experts > 1 and layer_number % self.moe_expert_interval == 0

    def is_mamba_layer(self, layer_number: int) -> bool:
        """Whether layer `layer_number` (0-based) is a Mamba layer (attention_config `mamba`)."""
        return self.attention_type(layer_number) == "mamba"

    @property
    def has_mamba(self) -> bool:
        return "mamba" in self.attention_types

    def attention_type(self, layer_number: int) -> str:
        """The attention kind of transformer layer `layer_number` (0-based)."""
        if not self.attention_types:
            return "global"
        return self.attention_types[layer_number]


def attention_window(attention_type: str, sliding_window_width: int | None) -> int | None:
    """How many keys (the query's own included) a query sees, or None for all earlier ones.
    `flash` with sliding_window_width W is flash-attn's causal window_size=(W, -1) as GPT-NeoX
    passes it: keys i-W .. i, W + 1 of them; `local` sees the W keys i-W+1 .. i."""
    if sliding_window_width is None:
        return None
    if attention_type == "flash":
        return sliding_window_width + 1
    if attention_type == "local":
        return sliding_window_width
    return None


def norm_bias(norm: str, use_bias_in_norms: bool | None) -> bool:
    """Whether norm layers get a bias. GPT-NeoX declares `use_bias_in_norms` but builds its
    LayerNorm with a bias and its RMSNorm and ScaleNorm without, whatever the key says; unset,
    this framework does the same, and a value set is honoured."""
    if use_bias_in_norms is None:
        return norm == "layernorm"
    return use_bias_in_norms


def model_config_from_args(args, padded_vocab_size: int) -> ModelConfig:
    """Resolve the run config's model section (and its derived values) into a `ModelConfig`."""
    m, d = args.model, args.derived
    norm_eps = {"layernorm": m.layernorm_epsilon, "rmsnorm": m.rms_norm_epsilon,
                "scalenorm": m.scalenorm_epsilon}[m.norm]
    return ModelConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_kv_heads=d.num_kv_heads,
        intermediate_size=d.intermediate_size,
        seq_length=m.seq_length,
        max_position_embeddings=m.max_position_embeddings,
        padded_vocab_size=padded_vocab_size,
        pos_emb=m.pos_emb,
        rotary_pct=m.rotary_pct,
        rotary_emb_base=m.rotary_emb_base,
        norm=m.norm,
        norm_epsilon=norm_eps,
        activation=m.activation,
        tied_embeddings=not m.no_weight_tying,
        gpt_j_residual=m.gpt_j_residual,
        gpt_j_tied=m.gpt_j_tied,
        use_bias_in_norms=norm_bias(m.norm, m.use_bias_in_norms),
        use_bias_in_attn_linear=m.use_bias_in_attn_linear,
        use_bias_in_mlp=m.use_bias_in_mlp,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        init_method=m.init_method,
        output_layer_init_method=m.output_layer_init_method,
        init_method_std=m.init_method_std,
        attention_types=tuple(d.attention_types),
        sliding_window_width=m.sliding_window_width,
        attention_softmax_in_fp32=m.attention_softmax_in_fp32,
        rmsnorm_fusion=m.rmsnorm_fusion,
        layernorm_fusion=m.layernorm_fusion,
        rope_fusion=m.rope_fusion,
        bias_gelu_fusion=m.bias_gelu_fusion,
        bias_dropout_fusion=m.bias_dropout_fusion,
        use_flashattn_swiglu=m.use_flashattn_swiglu,
        cpu_matmul_precision=m.cpu_matmul_precision,
        mamba_inner_size=d.mamba_inner_size if "mamba" in d.attention_types else 0,
        mamba_selective_scan_fusion=m.mamba_selective_scan_fusion,
        mamba_causal_conv_fusion=m.mamba_causal_conv_fusion,
        mamba_inner_func_fusion=m.mamba_inner_func_fusion,
        mamba_selective_fp32_params=m.mamba_selective_fp32_params,
        mamba_use_bias_in_conv=m.mamba_use_bias_in_conv,
        mamba_use_bias_in_linears=m.mamba_use_bias_in_linears,
        moe_num_experts=m.moe_num_experts,
        moe_expert_interval=m.moe_expert_interval,
        moe_top_k=m.moe_top_k,
        moe_router_type=m.moe_router_type,
        moe_normalize_topk=m.moe_normalize_topk,
        moe_jitter_eps=m.moe_jitter_eps,
        moe_lbl_in_fp32=m.moe_lbl_in_fp32,
        moe_aux_loss_coeff=m.moe_aux_loss_coeff,
        moe_z_loss_coeff=m.moe_z_loss_coeff,
        seed=args.training.seed,
        value_head=args.training.train_impl == "rm",
    )
