"""What each GPT-NeoX fusion flag selects here, said once at startup for every flag set to true.

GPT-NeoX's fusion flags pick its CUDA extension kernels. This project has none of those; per flag:

- scaled_upper_triang_masked_softmax_fusion, scaled_masked_softmax_fusion: attention always runs
  through torch's scaled_dot_product_attention, which computes scale, mask (causal, document,
  window, ALiBi bias) and softmax inside one fused kernel; the flags choose nothing more.
- layernorm_fusion: torch.nn.LayerNorm is already one fused op (native_layer_norm).
- rmsnorm_fusion: selects torch's rms_norm op (`FusedRMSNorm`, megatron/model/norms.py) instead
  of the written-out reference; same parameters, same fp32 computation.
- bias_gelu_fusion, bias_dropout_fusion, rope_fusion, use_flashattn_swiglu: no fused kernel
  exists here; the eager ops run (the linear layers add their bias inside the matmul).
"""

from __future__ import annotations

FUSION_FLAGS = (
    "scaled_upper_triang_masked_softmax_fusion", "scaled_masked_softmax_fusion",
    "bias_gelu_fusion", "bias_dropout_fusion", "rope_fusion", "layernorm_fusion",
    "rmsnorm_fusion", "use_flashattn_swiglu",
)

_SDPA = "torch scaled_dot_product_attention runs scale, {} and softmax as one fused kernel"


def _path(flag: str, model) -> str:
    """Which path runs for `flag` (set to true) with the model section `model`, and why."""
    if flag == "scaled_upper_triang_masked_softmax_fusion":
        return _SDPA.format("causal mask") + " in every layer, whatever this flag says"
    if flag == "scaled_masked_softmax_fusion":
        return (_SDPA.format("the mask (document, window, ALiBi)") +
                " in every layer, whatever this flag says")
    if flag == "layernorm_fusion":
        if model.norm != "layernorm":
            return f"norm is {model.norm}, not layernorm; nothing to fuse"
        return "torch.nn.LayerNorm is one fused op (native_layer_norm) on CPU and CUDA"
    if flag == "rmsnorm_fusion":
        if model.norm != "rmsnorm":
            return f"norm is {model.norm}, not rmsnorm; nothing to fuse"
        return "torch's rms_norm op runs instead of the written-out RMSNorm"
    if flag == "bias_gelu_fusion":
        if model.activation != "gelu":
            return f"activation is {model.activation}, not gelu; nothing to fuse"
        return ("no fused bias+gelu kernel here; the linear layer adds its bias inside the "
                "matmul, then eager gelu runs")
    if flag == "bias_dropout_fusion":
        return "no fused bias+dropout+add kernel here; eager bias add, dropout and residual add run"
    if flag == "rope_fusion":
        if model.pos_emb != "rotary":
            return f"pos_emb is {model.pos_emb}, not rotary; nothing to fuse"
        return "no fused rotary kernel here; the eager rotate-half rotary (in fp32) runs"
    if flag == "use_flashattn_swiglu":
        if model.activation != "swiglu":
            return f"activation is {model.activation}, not swiglu; nothing to fuse"
        return "no flash-attn SwiGLU kernel here; the eager silu(gate) * value runs"
    raise ValueError(f"{flag!r} is not a fusion flag; valid: {', '.join(FUSION_FLAGS)}")


def fusion_paths(model) -> list[str]:
    """One line `<flag>: <path that runs and why>` for every fusion flag set to true in the
    model section `model`."""
    return [f"{flag}: {_path(flag, model)}" for flag in FUSION_FLAGS if getattr(model, flag)]
