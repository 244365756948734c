"""Which implementation each GPT-NeoX fusion flag selects, and the one line per flag said at startup.

GPT-NeoX's fusion flags pick its CUDA extension kernels, built with a C++ toolchain. Here they
pick Triton kernels (megatron/model/triton_kernels.py), compiled by Triton at first use, with
no build step; each sits behind the signature of the torch code it replaces, and that torch code
runs wherever the kernel cannot (CPU tensors, or no `triton` installed). Per flag:

- scaled_upper_triang_masked_softmax_fusion, scaled_masked_softmax_fusion: attention always runs
  through torch's scaled_dot_product_attention, which computes scale, mask (causal, document,
  window, ALiBi bias) and softmax inside one fused kernel (flash or memory-efficient on a GPU),
  or, for plain causal bf16 or fp32 attention on CPU tensors of up to 768 positions, through
  our blocked kernel, which is faster there (megatron/model/cpu_attention.py); the flags choose
  nothing more.
- layernorm_fusion, rmsnorm_fusion: the Triton norm kernel, forward and backward. Without it,
  torch.nn.LayerNorm (one op already) and torch's rms_norm op.
- rope_fusion: the Triton rotate-half rotary kernel on queries and keys.
- bias_gelu_fusion: as in GPT-NeoX, GELU's tanh approximation of (x W^T + b), the bias added
  inside the Triton kernel rather than the matmul; without the kernel, torch's tanh GELU. The
  approximation is part of the flag's meaning, on every device.
- bias_dropout_fusion: residual + dropout(x) in one Triton kernel whose mask is drawn from
  torch's generator (the bias is added by the matmul).
- use_flashattn_swiglu: the Triton SwiGLU kernel, forward and backward.

No flag selects the softmax cross entropy (`cross_entropy`, megatron/mpu/cross_entropy.py): on
GPU tensors it runs two Triton kernels, one read of the logits each way; elsewhere torch ops on
blocks of logits. `cross_entropy_path` is the line a GPU run logs about it.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from megatron.model import cpu_attention

FUSION_FLAGS = (
    "scaled_upper_triang_masked_softmax_fusion", "scaled_masked_softmax_fusion",
    "bias_gelu_fusion", "bias_dropout_fusion", "rope_fusion", "layernorm_fusion",
    "rmsnorm_fusion", "use_flashattn_swiglu",
)

_SDPA = "torch scaled_dot_product_attention runs scale, {} and softmax as one fused kernel"
_on_cpu = False


@functools.cache
def triton_kernels():
    """The Triton kernel module, or None where `triton` is not installed."""
    try:
        from megatron.model import triton_kernels as kernels
    except ImportError:
        return None
    return kernels


def _interpreted() -> bool:
    from triton import knobs

    return bool(knobs.runtime.interpret)


@contextlib.contextmanager
def triton_on_cpu():
    """Run the Triton kernels on CPU tensors too, through Triton's interpreter; the process must
    have started with TRITON_INTERPRET=1 (it decides how kernels are built at import). For tests:
    the interpreter is far slower than the torch code."""
    global _on_cpu
    if triton_kernels() is None or not _interpreted():
        raise RuntimeError("Triton kernels on CPU tensors need `triton` installed and "
                           "TRITON_INTERPRET=1 set before the process starts")
    saved, _on_cpu = _on_cpu, True
    try:
        yield
    finally:
        _on_cpu = saved


def use_triton(x: torch.Tensor, compiled: bool = False) -> bool:
    """Whether the Triton kernels run on tensor x: a GPU tensor with `triton` installed (or a CPU
    tensor inside `triton_on_cpu`), outside a region torch.compile traces (torch_compile:
    inductor fuses those ops itself, megatron/model/compile.py) unless `compiled` (a kernel
    that runs there too, as an operator inductor keeps opaque: the rotary)."""
    if (torch.compiler.is_compiling() and not compiled) or triton_kernels() is None:
        return False
    return x.is_cuda or (_on_cpu and x.device.type == "cpu")


def _kernel_path(kernel: str, fallback: str) -> str:
    if triton_kernels() is None:
        return f"`triton` is not installed, so {fallback} runs (pip install triton)"
    return f"the Triton {kernel} on GPU tensors; {fallback} on CPU tensors"


def _path(flag: str, model) -> str:
    """Which path runs for `flag` (set to true) with the model section `model`, and why."""
    if flag == "scaled_upper_triang_masked_softmax_fusion":
        return (_SDPA.format("causal mask") + " in every layer, whatever this flag says (on "
                "CPU tensors plain causal bf16 or fp32 attention of up to "
                f"{cpu_attention.MAX_POSITIONS} positions runs through our blocked kernel "
                "instead, megatron/model/cpu_attention.py)")
    if flag == "scaled_masked_softmax_fusion":
        return (_SDPA.format("the mask (document, window, ALiBi)") +
                " in every layer, whatever this flag says")
    if flag in ("layernorm_fusion", "rmsnorm_fusion"):
        norm = flag.split("_")[0]
        if model.norm != norm:
            return f"norm is {model.norm}, not {norm}; nothing to fuse"
        torch_op = "torch.nn.LayerNorm" if norm == "layernorm" else "torch's rms_norm op"
        return _kernel_path(f"{norm} kernel (forward and backward)", torch_op)
    if flag == "bias_gelu_fusion":
        if model.activation != "gelu":
            return f"activation is {model.activation}, not gelu; nothing to fuse"
        return ("GELU's tanh approximation, as GPT-NeoX: " +
                _kernel_path("bias+gelu kernel", "torch's gelu(approximate='tanh')"))
    if flag == "bias_dropout_fusion":
        return _kernel_path("dropout+residual-add kernel", "eager dropout and add")
    if flag == "rope_fusion":
        if model.pos_emb != "rotary":
            return f"pos_emb is {model.pos_emb}, not rotary; nothing to fuse"
        return _kernel_path("rotary kernel", "the eager rotate-half rotary (in fp32)")
    if flag == "use_flashattn_swiglu":
        if model.activation != "swiglu":
            return f"activation is {model.activation}, not swiglu; nothing to fuse"
        return _kernel_path("SwiGLU kernel (forward and backward)", "eager silu(gate) * value")
    raise ValueError(f"{flag!r} is not a fusion flag; valid: {', '.join(FUSION_FLAGS)}")


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, tp, fp32: bool = True
                  ) -> torch.Tensor:
    """The per-token vocab-parallel cross entropy (megatron/mpu/cross_entropy.py), through the
    Triton kernels where they run on `logits`."""
    from megatron.mpu.cross_entropy import vocab_parallel_cross_entropy

    kernels = triton_kernels() if use_triton(logits) else None
    return vocab_parallel_cross_entropy(logits, labels, tp, fp32=fp32, kernels=kernels)


def cross_entropy_path() -> str:
    """The start-up line of a GPU run about its cross entropy."""
    if triton_kernels() is None:
        return ("cross entropy: torch ops over blocks of logits, since `triton` is not "
                "installed (pip install triton for the two-kernel path)")
    return ("cross entropy: the Triton kernels on GPU tensors (each token's logits read once "
            "in the forward and once in the backward, no fp32 copy); with dpo_fp32 or kto_fp32 "
            "false, torch ops in the logits' dtype")


def fusion_paths(model) -> list[str]:
    """One line `<flag>: <path that runs and why>` for every fusion flag set to true in the
    model section `model`."""
    return [f"{flag}: {_path(flag, model)}" for flag in FUSION_FLAGS if getattr(model, flag)]
