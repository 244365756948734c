"""Normalisation layers by GPT-NeoX name: layernorm, rmsnorm, scalenorm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model.fusions import triton_kernels, use_triton


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (and an optional bias)."""

    def __init__(self, dim: int, eps: float, bias: bool = False):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        out = out * self.weight
        return out + self.bias if self.bias is not None else out


class FusedRMSNorm(RMSNorm):
    """RMSNorm through the Triton norm kernel, or torch's rms_norm op where it cannot run
    (rmsnorm_fusion); `RMSNorm` is its reference."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x):
            return triton_kernels().norm(x, self.weight, self.bias, self.eps, rms=True)
        out = F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype) * self.weight
        return out + self.bias if self.bias is not None else out


class ScaleNorm(nn.Module):
    """x / ||x|| scaled by one learned scalar g (Nguyen & Salazar, 2019)."""

    def __init__(self, dim: int, eps: float, bias: bool = False):
        super().__init__()
        del dim, bias
        self.eps = eps
        self.g = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = torch.norm(x.float(), dim=-1, keepdim=True).clamp(min=self.eps)
        return (x.float() / n * self.g).to(x.dtype)


class FusedLayerNorm(nn.LayerNorm):
    """LayerNorm through the Triton norm kernel where it can run (layernorm_fusion), else
    torch's; the same parameters as nn.LayerNorm, its reference."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x):
            return triton_kernels().norm(x, self.weight, self.bias, self.eps, rms=False)
        return super().forward(x)


def _layernorm(dim: int, eps: float, bias: bool) -> nn.Module:
    return nn.LayerNorm(dim, eps=eps, bias=bias)


NORMS = {"layernorm": _layernorm, "rmsnorm": RMSNorm, "scalenorm": ScaleNorm}


def build_norm(config) -> nn.Module:
    """The norm layer the model config names, over the hidden size."""
    if config.norm not in NORMS:
        raise ValueError(f"norm {config.norm!r} is not known; valid: {', '.join(sorted(NORMS))}")
    if config.norm == "rmsnorm" and config.rmsnorm_fusion:
        return FusedRMSNorm(config.hidden_size, config.norm_epsilon, config.use_bias_in_norms)
    if config.norm == "layernorm" and config.layernorm_fusion:
        return FusedLayerNorm(config.hidden_size, eps=config.norm_epsilon,
                              bias=config.use_bias_in_norms)
    return NORMS[config.norm](config.hidden_size, config.norm_epsilon, config.use_bias_in_norms)
