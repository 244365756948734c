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
        exponents = torch.arange(0, rotary_ndims, 2, dtype=torch.float32) / rotary_ndims
        inv_freq = 1.0 / (base ** exponents)
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
        if cos.requires_grad or sin.requires_grad:  # tables to learn: let autograd see it all
            return _turn(x, cos, sin, 1)
        return _Rotate.apply(x, cos, sin)


def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: int) -> torch.Tensor:
    """The first r = cos.shape[-1] channels of x turned by the tables' angles (sign 1) or back
    (sign -1), computed in fp32 (fp64 for fp64 x) and rounded to x's dtype once; the other
    channels pass through.

    With halves x1, x2 and c, s the tables: forward y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2; back
    x1 = y1 c1 + y2 s2, x2 = y2 c2 - y1 s1, the same form with sign -1 and the halves of sin
    swapped. One conversion to fp32, three fp32 passes (the addcmuls in place) and one
    conversion back: a third of the passes of the rotate-half expression, and a backward of
    the same cost rather than autograd's through its cat, slices and conversions."""
    r = cos.shape[-1]
    half = r // 2
    turned = x[..., :r].to(torch.promote_types(x.dtype, torch.float32))
    y = turned * cos
    y[..., :half].addcmul_(turned[..., half:], sin[..., :half], value=-sign)
    y[..., half:].addcmul_(turned[..., :half], sin[..., half:], value=sign)
    if r == x.shape[-1]:
        return y.to(x.dtype)
    return torch.cat((y.to(x.dtype), x[..., r:]), dim=-1)


class _Rotate(torch.autograd.Function):
    """Rotary on constant cos/sin tables; the backward turns the gradient back."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _turn(x, cos, sin, 1)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        half = sin.shape[-1] // 2
        swapped = torch.cat((sin[..., half:], sin[..., :half]), dim=-1)
        return _turn(grad, cos, swapped, -1), None, None


def sinusoidal_table(max_positions: int, dim: int) -> torch.Tensor:
    """The fixed sin/cos position table of "Attention Is All You Need": [max_positions, dim].

    GPT-NeoX's layout: the sines of all ceil(dim / 2) frequencies first, then their cosines
    (not interleaved), frequency j being 10000 ** (-2j / dim), computed in fp32. For an odd
    `dim` GPT-NeoX's table has dim + 1 columns and adding it to the hidden state fails; here it
    is cut to `dim` columns, dropping the last cosine.
    """
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))  # [f]
    angles = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1) * inv_freq  # [p, f]
    return torch.cat((angles.sin(), angles.cos()), dim=-1)[:, :dim].contiguous()  # [p, dim]


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
