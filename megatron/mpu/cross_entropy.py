"""Cross entropy over vocab-parallel logits without gathering the full vocabulary."""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.mpu.groups import TensorParallel


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, tp, fp32=True):
        # logits: [b, s, V/tp] (this rank's vocab slice), labels: [b, s] full-vocab ids
        logits = logits.float() if fp32 else logits.clone()
        per_rank = logits.shape[-1]
        start = tp.rank * per_rank
        max_logit = logits.max(dim=-1, keepdim=True).values
        dist.all_reduce(max_logit, op=dist.ReduceOp.MAX, group=tp.group)
        shifted = logits - max_logit
        outside = (labels < start) | (labels >= start + per_rank)
        local = (labels - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        dist.all_reduce(picked, group=tp.group)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(sum_exp, group=tp.group)
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local, outside)
        return sum_exp.log() - picked  # [b, s]

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        grad_logits = softmax.clone()
        inside = (~outside).to(grad_logits.dtype)
        grad_logits.scatter_add_(-1, local.unsqueeze(-1), -inside.unsqueeze(-1))
        return (grad_logits * grad.unsqueeze(-1)).to(grad.dtype), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor,
                                 tp: TensorParallel, fp32: bool = True) -> torch.Tensor:
    """Per-token loss [b, s] for logits split over the vocabulary ([b, s, V/tp] on each rank),
    computed in fp32 (or, with `fp32` false, in the logits' own dtype)."""
    if not tp.enabled:
        return torch.nn.functional.cross_entropy(
            (logits.float() if fp32 else logits).flatten(0, 1), labels.flatten(),
            reduction="none").view(labels.shape)
    return _VocabParallelCrossEntropy.apply(logits, labels, tp, fp32)
