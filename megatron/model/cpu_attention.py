"""Causal attention for CPU tensors in query blocks, with a backward that reuses the forward's
probabilities.

torch SDPA's CPU flash kernel computes plain causal attention at a fraction of the matmul speed
the same CPU reaches on the products it is made of (its backward above all). This kernel runs the
same attention as a loop over blocks of `BLOCK` queries. Block i multiplies its queries with the
keys up to its last position only, so the products above the causal diagonal are never computed,
and every product is one batched matmul over all heads (oneDNN's kernels):

    scores = q_i k[:e]^T * scale      # [b*kv, g*B, e], e = the block's last position + 1
    probs  = softmax(scores, fp32)    # keys after each query's position masked out first
    out_i  = probs v[:e]

The backward takes each block's probabilities as the forward left them and accumulates the key
and value gradients in fp32. Keeping them costs about s(s + BLOCK)/2 values per sequence and
head (cpu_attention_blocks.kept_probabilities: 13.5 MiB a layer for 4 x 12 heads of 512
positions in bf16), a little over half of the [s, s] probabilities GPT-NeoX's unfused attention
keeps, where SDPA keeps none and recomputes them. Not recomputing them saves a product and a
softmax per block.

Numerics: the products run in the inputs' dtype (fp32 or bf16) with fp32 accumulation, and the
softmax and its gradient accumulate in fp32. In bf16 the scores are rounded to bf16 before the
softmax, as GPT-NeoX's own (non-flash) attention does with its bf16 `baddbmm`, and the softmax
returns bf16 probabilities, which its gradient is computed from, as GPT-NeoX's fused softmax
keeps its half-precision output for the backward; SDPA's CPU kernel keeps both in fp32. Taking
the softmax from and to bf16 saves conversion passes over each block's scores.

Grouped-query attention (k and v with fewer heads than q) runs without repeating k and v: the
`g` query heads that share a key head are stacked as rows of one product.

Where it runs: `supports` says yes for plain causal attention (no mask, no dropout) on CPU bf16
or fp32 tensors of up to `MAX_POSITIONS` positions; everything else goes through torch SDPA.
Measured with `python bench/attention.py --dtypes bf16` on a 2-core AVX-512 CPU, forward and
backward, with the host-memory setting of training (the bench's default), SDPA/ours: 2.5x at
128 positions, 2.0x at 256 and 512, 1.5x at 768; 1.4x at 1024 and 1.1-1.2x at 2048, where the
probabilities kept would grow with s^2 (2.3 GiB over the 12 layers of a 125M model for 4
sequences of 2048), so longer sequences stay with SDPA. A run just before, of the kernel that
recomputed its probabilities: 2.3x, 1.7x, 1.8x and 1.2x from 128 to 768 positions. fp32
(`--dtypes fp32`, torch 2.13): 1.0x at 128 positions, 1.2x at 256, 1.5x at 512 (1.3x with
128-wide heads), 1.1x at 768 and 1024, 0.9-1.0x at 2048; in a 125M-class fp32 training step SDPA
took a tenth of the time. The probabilities kept are fp32 there (27 MiB a layer at 512
positions). The tests check fp32 against fp64.
"""

from __future__ import annotations

import functools

import torch

from megatron.model.cpu_attention_blocks import BLOCK, MAX_POSITIONS

PATH_LINE = ("attention on CPU tensors: plain causal bf16 or fp32 attention of up to "
             f"{MAX_POSITIONS} positions runs in blocks of {BLOCK} queries "
             "(megatron/model/cpu_attention.py); other attention through torch SDPA")


def supports(q: torch.Tensor, k: torch.Tensor, mask, dropout_p: float) -> bool:
    """Whether this kernel takes the call: plain causal attention (no mask) over as many keys
    as queries, without dropout, on CPU bf16 or fp32 tensors of up to MAX_POSITIONS positions,
    outside torch.compile (inductor writes its own attention there)."""
    return (mask is None and dropout_p == 0.0 and q.device.type == "cpu"
            and q.dtype == k.dtype and q.dtype in (torch.bfloat16, torch.float32)
            and q.shape[2] == k.shape[2]
            and q.shape[2] <= MAX_POSITIONS and q.shape[1] % k.shape[1] == 0
            and not torch.compiler.is_compiling())


def blocked_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [b, h, s, d], k and v [b, kv, s, d] -> [b, h, s, d]: softmax(q k^T / sqrt(d)) v with
    query i attending to keys 0..i."""
    return _BlockedCausalAttention.apply(q, k, v)


def _grouped(q: torch.Tensor, kv: int) -> torch.Tensor:
    b, h, s, d = q.shape
    return q.view(b * kv, h // kv, s, d)  # [b*kv, g, s, d]: the g query heads of a key head


def _rows(q5: torch.Tensor, i0: int, i1: int) -> torch.Tensor:
    """[b*kv, g, s, d] -> the block's queries as rows of one product, [b*kv, g*B, d]."""
    n, g, _, d = q5.shape
    return q5[:, :, i0:i1].reshape(n, g * (i1 - i0), d)


def _prefix(x3: torch.Tensor, i1: int) -> torch.Tensor:
    """Positions 0..i1-1 of [b*kv, s, d]; copied in bf16, where oneDNN multiplies a strided
    batch at half speed (in fp32 the copy costs more than it saves)."""
    return x3[:, :i1].contiguous() if x3.dtype == torch.bfloat16 else x3[:, :i1]


def _probs(q_rows: torch.Tensor, keys: torch.Tensor, i0: int, i1: int, g: int,
           scale: float) -> torch.Tensor:
    """Probabilities [b*kv, g*B, i1] of a query block over the keys up to position i1, in the
    inputs' dtype (the softmax accumulates in fp32 whatever the dtype)."""
    scores = _scaled_bmm(q_rows, keys.transpose(1, 2), scale)  # [b*kv, g*B, i1]
    n, rows, _ = scores.shape
    diagonal = scores.view(n, g, rows // g, i1)[..., i0:i1]  # [b*kv, g, B, B]
    diagonal.add_(_causal_bias(i1 - i0, scores.dtype))
    return torch.softmax(scores, dim=-1)


@functools.lru_cache(maxsize=8)
def _causal_bias(n: int, dtype: torch.dtype) -> torch.Tensor:
    """[n, n]: 0 where the key is at or before the query, -inf after it (an add is ten times
    faster than a masked_fill on the strided diagonal block)."""
    later = torch.ones(n, n, dtype=torch.bool).triu_(1)
    return torch.zeros(n, n, dtype=dtype).masked_fill_(later, float("-inf"))


def _scaled_bmm(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """scale * (a @ b), the scale applied inside the product (no pass of its own)."""
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[2])
    return torch.baddbmm(out, a, b, beta=0.0, alpha=scale, out=out)


class _BlockedCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        b, h, s, d = q.shape
        kv = k.shape[1]
        g, scale = h // kv, d ** -0.5
        q5, k3, v3 = _grouped(q, kv), k.reshape(b * kv, s, d), v.reshape(b * kv, s, d)
        out = torch.empty_like(q5)  # [b*kv, g, s, d]
        blocks = []  # each block's probabilities, for the backward
        for i0 in range(0, s, BLOCK):
            i1 = min(i0 + BLOCK, s)
            probs = _probs(_rows(q5, i0, i1), _prefix(k3, i1), i0, i1, g, scale)
            blocks.append(probs)
            block = torch.bmm(probs, _prefix(v3, i1))  # [b*kv, g*B, d]
            out[:, :, i0:i1] = block.view(b * kv, g, i1 - i0, d)
        ctx.save_for_backward(q, k, v, *blocks)
        return out.view(b, h, s, d)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, *blocks = ctx.saved_tensors
        b, h, s, d = q.shape
        kv = k.shape[1]
        g, scale = h // kv, d ** -0.5
        q5, k3, v3 = _grouped(q, kv), k.reshape(b * kv, s, d), v.reshape(b * kv, s, d)
        g5 = _grouped(grad_out.contiguous(), kv)
        dq = torch.empty_like(q5)
        dk = torch.zeros(b * kv, s, d, dtype=torch.float32)
        dv = torch.zeros(b * kv, s, d, dtype=torch.float32)
        for i0, probs in zip(range(0, s, BLOCK), blocks):  # probs: [b*kv, g*B, i1]
            i1 = min(i0 + BLOCK, s)
            keys, values = _prefix(k3, i1), _prefix(v3, i1)
            q_rows, g_rows = _rows(q5, i0, i1), _rows(g5, i0, i1)  # [b*kv, g*B, d]
            dv[:, :i1] += torch.bmm(probs.transpose(1, 2), g_rows).float()
            dprobs = torch.bmm(g_rows, values.transpose(1, 2))
            dscores = torch._softmax_backward_data(dprobs, probs, -1, q.dtype)
            dq[:, :, i0:i1] = _scaled_bmm(dscores, keys, scale).view(b * kv, g, i1 - i0, d)
            dk[:, :i1] += _scaled_bmm(dscores.transpose(1, 2), q_rows, scale).float()
        return (dq.view(b, h, s, d), dk.view(b, kv, s, d).to(k.dtype),
                dv.view(b, kv, s, d).to(v.dtype))
