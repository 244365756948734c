"""Activation functions by GPT-NeoX name; gated ones (geglu, swiglu, reglu) halve their input."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron.model.fusions import triton_kernels, use_triton


def _gated(act):
    def gated(x: torch.Tensor) -> torch.Tensor:
        # x: [..., 2f] -> [..., f]; the second half is the gate.
        value, gate = x.chunk(2, dim=-1)
        return act(gate) * value
    return gated


ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "geglu": _gated(F.gelu),
    "swiglu": _gated(F.silu),
    "reglu": _gated(F.relu),
}


def get_activation(name: str):
    """The activation callable for `name`; an unknown name lists the valid ones."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not known; valid: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


def fused_swiglu(x: torch.Tensor) -> torch.Tensor:
    """swiglu (use_flashattn_swiglu): the Triton kernel where it can run, else the reference."""
    if use_triton(x):
        return triton_kernels().gated(x, "silu")
    return ACTIVATIONS["swiglu"](x)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """GELU's tanh approximation of x + bias (bias_gelu_fusion, GPT-NeoX's function): the Triton
    kernel where it can run, else torch's tanh GELU."""
    if use_triton(x):
        return triton_kernels().bias_gelu(x, bias)
    return F.gelu(x + bias if bias is not None else x, approximate="tanh")
