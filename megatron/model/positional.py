"""Positional encodings: rotary (GPT-NeoX's rotate-half form), sinusoidal, and ALiBi slopes."""

from __future__ import annotations

import math

import torch

from megatron.model.fusions import triton_kernels, use_triton


class RotaryEmbedding(torch.nn.Module):
    """Rotary position embedding on the first `rotary_ndims` channels of each head."""

    def __init__(self, rotary_ndims: int, base: float, max_positions: int, fused: bool = False):
        super().__init__()
        self.rotary_ndims = rotary_ndims
        self.fused = fused  # rope_fusion: the Triton kernel where it can run
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_ndims, 2, dtype=torch.float32) / rotary_ndims))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.max_positions = max_positions

    def cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin tables for `position_ids` [b, s] -> each [b, 1, s, rotary_ndims] (fp32)."""
        freqs = position_ids.float().unsqueeze(-1) * self.inv_freq  # [b, s, r/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [b, s, r]
        return emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate the first rotary_ndims channels of x [b, heads, s, d]; pass the rest through."""
        if self.fused and use_triton(x, compiled=True):  # compiled layers too: see rotary()
            return triton_kernels().rotary(x, cos, sin)
        r = self.rotary_ndims
        x_rot, x_pass = x[..., :r], x[..., r:]
        half = r // 2
        rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
        x_rot = (x_rot.float() * cos + rotated.float() * sin).to(x.dtype)
        return torch.cat((x_rot, x_pass), dim=-1) if x_pass.shape[-1] else x_rot


def sinusoidal_table(max_positions: int, dim: int) -> torch.Tensor:
    """The fixed sin/cos position table of "Attention Is All You Need": [max_positions, dim]."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1) * inv_freq
    table = torch.zeros(max_positions, dim)
    table[:, 0::2] = angles.sin()
    table[:, 1::2] = angles.cos()[:, : table[:, 1::2].shape[1]]
    return table


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes (Press et al.), for any head count: [num_heads]."""
    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return torch.tensor(power_of_2(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = power_of_2(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(power_of_2(closest) + extra)
