"""Cross entropy over (vocab-parallel) logits, computed a block of tokens at a time.

The loss of a token is logsumexp(logits) - logits[label], in fp32 (or, with `fp32` false, in
the logits' own dtype). A plain `cross_entropy(logits.float())` makes an fp32 copy of the whole
[tokens, vocabulary] logits and keeps its log-softmax, the same size again, for the backward:
for GPT-2's 50257-token vocabulary and 16k tokens a step that is two 3.3 GB tensors. Here the
logits are read in blocks of about BLOCK_ELEMENTS values: the forward keeps only one log-sum-exp
per token (and the logits themselves, which the backward needs anyway), and the backward
writes the gradient block by block in the logits' dtype. Under tensor parallelism each rank
holds a slice of the vocabulary and the per-token log-sum-exps and label logits are combined
over the tensor-parallel group: the full logits are never gathered.

Given `kernels` (megatron/model/triton_kernels.py; the model passes them for GPU tensors,
`fusions.cross_entropy`), two Triton kernels take the place of the blocks in fp32: the forward
reads each token's row once, keeping a running maximum and sum, and the backward reads it once
more and writes the gradient in the logits' dtype. The blocks' torch ops make about nine passes
over fp32 copies of the logits instead; for a 16k-token step over GPT-2's vocabulary that is
tens of GB of memory traffic against about 5 GB.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.mpu.blocks import BLOCK_ELEMENTS
from megatron.mpu.groups import TensorParallel

# On a CPU the forward and the backward take smaller blocks: a few MiB stay in the CPU's caches
# between the passes over a block (max, subtract and exp, sum; cast, subtract, exp, scale).
# torch.logsumexp over the large blocks took 3x as long on a 2048 x 50257 fp32 block on a CPU,
# and the backward of 2048 x 50304 bf16 logits 262 ms against 119 ms in these blocks
LSE_BLOCK_ELEMENTS = 1 << 20


def lse_block_elements(device: torch.device, block_elements: int) -> int:
    """The block, forward and backward, for logits on `device`: the small cache-sized block on
    a CPU; elsewhere the full block. Each block costs about eighteen ops (kernel launches on a
    GPU), and a GPU's passes are bound by launches, not caches: small blocks of a 16k-token x
    50304 step would be some 820 blocks, about 15,000 ops in every forward."""
    if torch.device(device).type == "cpu":
        return min(block_elements, LSE_BLOCK_ELEMENTS)
    return block_elements


def _blocks(tokens: int, vocab: int, block_elements: int):
    rows = max(1, block_elements // max(vocab, 1))
    for start in range(0, tokens, rows):
        yield slice(start, min(start + rows, tokens))


def _logsumexp(flat: torch.Tensor, dtype: torch.dtype, block_elements: int) -> torch.Tensor:
    """log(sum(exp(row))) of each row of `flat` [N, V] in `dtype`, shifted by the row's maximum
    (0 where that is not finite, so an all -inf row gives -inf as torch.logsumexp does)."""
    n, vocab = flat.shape
    lse = torch.empty(n, dtype=dtype, device=flat.device)
    buffer = None
    for rows in _blocks(n, vocab, block_elements):
        block = flat[rows]
        if buffer is None:
            buffer = torch.empty(block.shape, dtype=dtype, device=flat.device)
        if block.dtype == dtype or not block.is_cpu:  # a GPU subtracts across dtypes in one pass
            top = _finite(block.amax(dim=-1, keepdim=True).to(dtype))
            shifted = torch.sub(block, top, out=buffer[:block.shape[0]])
        else:  # a CPU runs that subtraction in a slower loop: convert first
            shifted = buffer[:block.shape[0]].copy_(block)
            top = _finite(shifted.amax(dim=-1, keepdim=True))
            shifted.sub_(top)
        lse[rows] = shifted.exp_().sum(dim=-1).log_().add_(top.squeeze(-1))
    return lse


def _finite(top: torch.Tensor) -> torch.Tensor:
    """A row's maximum as the shift, 0 where it is not finite (an all -inf row)."""
    return top.masked_fill(~torch.isfinite(top), 0.0)


class _BlockedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, tp, fp32, block_elements, kernels):
        # logits: [..., V/tp] (this rank's vocabulary slice), labels: [...] full-vocab ids
        dtype = torch.float32 if fp32 else logits.dtype
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        ids = labels.reshape(-1)
        start = tp.rank * vocab if tp.enabled else 0
        outside = (ids < start) | (ids >= start + vocab)
        local = (ids - start).masked_fill(outside, 0)
        picked = flat.gather(-1, local.unsqueeze(-1)).squeeze(-1).to(dtype).masked_fill(outside, 0)
        fused = kernels if fp32 else None
        if fused is not None:
            lse = fused.logsumexp_rows(flat)
        else:
            lse = _logsumexp(flat, dtype, lse_block_elements(flat.device, block_elements))
        if tp.enabled:  # log(sum over ranks of exp(lse_r)), shifted by the largest for range
            top = lse.clone()
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=tp.group)
            total = (lse - top).exp()
            dist.all_reduce(total, group=tp.group)
            lse = total.log() + top
            dist.all_reduce(picked, group=tp.group)
        ctx.save_for_backward(logits, lse, local, outside)
        ctx.dtype, ctx.block_elements, ctx.fused = dtype, block_elements, fused
        return (lse - picked).view(labels.shape)

    @staticmethod
    def backward(ctx, grad):
        logits, lse, local, outside = ctx.saved_tensors
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        scale = grad.reshape(-1).to(ctx.dtype)
        if ctx.fused is not None:
            label = local.masked_fill(outside, -1)
            out = ctx.fused.cross_entropy_grad(flat, lse, scale, label)
            return out.view_as(logits), None, None, None, None, None
        hit = (~outside).to(ctx.dtype).unsqueeze(-1)
        out = torch.empty_like(flat)
        for rows in _blocks(flat.shape[0], vocab, lse_block_elements(flat.device,
                                                                     ctx.block_elements)):
            # grad * (softmax - one-hot of the label), written in place where the dtypes agree
            target = out[rows]
            if out.dtype == ctx.dtype:
                probs = torch.sub(flat[rows], lse[rows].unsqueeze(-1), out=target)
            else:
                probs = flat[rows].to(ctx.dtype).sub_(lse[rows].unsqueeze(-1))
            weight = scale[rows].unsqueeze(-1)
            probs.exp_().mul_(weight)
            probs.scatter_add_(-1, local[rows].unsqueeze(-1), -hit[rows] * weight)
            if probs is not target:
                target.copy_(probs)
        return out.view_as(logits), None, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor,
                                 tp: TensorParallel, fp32: bool = True,
                                 block_elements: int = BLOCK_ELEMENTS, kernels=None) -> torch.Tensor:
    """Per-token loss (labels' shape) for logits split over the vocabulary ([..., V/tp] on each
    rank), computed in fp32 (or, with `fp32` false, in the logits' own dtype) a block of
    `block_elements` logits at a time, or with fp32 through `kernels` (the Triton kernel module)
    where given (see the module docstring)."""
    return _BlockedCrossEntropy.apply(logits, labels, tp, fp32, block_elements, kernels)
