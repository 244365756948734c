"""Autograd-aware communication for tensor and sequence parallelism.

Each function is identity when the tensor-parallel size is 1. Names say what happens in the
forward pass; the backward pass does the conjugate (copy <-> all-reduce, split <-> gather,
all-gather <-> reduce-scatter).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.mpu.groups import TensorParallel


def all_reduce_sum(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """The sum of `x` over the tensor-parallel group, in place where it can be; a bf16/fp16
    tensor is summed in fp32 and rounded once with `tp.fp32_reduce` (GPT-NeoX's
    fp32_allreduce). Not autograd-aware."""
    x = x.contiguous()
    if tp.fp32_reduce and x.dtype in (torch.bfloat16, torch.float16):
        wide = x.float()
        dist.all_reduce(wide, group=tp.group)
        return wide.to(x.dtype)
    dist.all_reduce(x, group=tp.group)
    return x


_all_reduce = all_reduce_sum


def _split(x: torch.Tensor, dim: int, tp: TensorParallel) -> torch.Tensor:
    if x.shape[dim] % tp.size:
        raise ValueError(f"dimension {dim} of size {x.shape[dim]} does not split into "
                         f"{tp.size} tensor-parallel parts")
    return x.chunk(tp.size, dim=dim)[tp.rank].contiguous()


def _gather(x: torch.Tensor, dim: int, tp: TensorParallel) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x.contiguous(), group=tp.group)
    return torch.cat(parts, dim=dim)


def _reduce_scatter(x: torch.Tensor, dim: int, tp: TensorParallel) -> torch.Tensor:
    # gloo has no reduce_scatter: all-reduce, then keep this rank's part
    return _split(_all_reduce(x.clone(), tp), dim, tp)


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.clone(), ctx.tp), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):
        return _all_reduce(x.clone(), tp)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherAlong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, tp):
        ctx.dim, ctx.tp = dim, tp
        return _gather(x, dim, tp)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, ctx.dim, ctx.tp), None, None


class _ScatterAlong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, tp):
        ctx.dim, ctx.tp = dim, tp
        return _split(x, dim, tp)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.dim, ctx.tp), None, None


class _AllGatherSequence(torch.autograd.Function):
    """Forward all-gather along the sequence; backward reduce-scatter (the input fed TP math)."""

    @staticmethod
    def forward(ctx, x, dim, tp):
        ctx.dim, ctx.tp = dim, tp
        return _gather(x, dim, tp)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.dim, ctx.tp), None, None


class _ReduceScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, tp):
        ctx.dim, ctx.tp = dim, tp
        return _reduce_scatter(x, dim, tp)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.dim, ctx.tp), None, None


def copy_to_tensor_parallel(x, tp: TensorParallel):
    """Identity forward; all-reduce of the gradient backward (input of a column-parallel layer)."""
    return _CopyToTP.apply(x, tp) if tp.enabled else x


def reduce_from_tensor_parallel(x, tp: TensorParallel):
    """All-reduce forward (output of a row-parallel layer); identity backward."""
    return _ReduceFromTP.apply(x, tp) if tp.enabled else x


def gather_from_tensor_parallel(x, tp: TensorParallel, dim: int = -1):
    """Concatenate every rank's part along `dim`; backward keeps this rank's slice."""
    return _GatherAlong.apply(x, dim % x.dim(), tp) if tp.enabled else x


def scatter_to_tensor_parallel(x, tp: TensorParallel, dim: int = -1):
    """Keep this rank's slice along `dim`; backward all-gathers."""
    return _ScatterAlong.apply(x, dim % x.dim(), tp) if tp.enabled else x


def gather_from_sequence_parallel(x, tp: TensorParallel, dim: int = 1):
    """All-gather the sequence shards [b, s/tp, h] -> [b, s, h]; backward reduce-scatters."""
    return _AllGatherSequence.apply(x, dim, tp) if tp.enabled else x


def reduce_scatter_to_sequence_parallel(x, tp: TensorParallel, dim: int = 1):
    """Sum partial results and keep this rank's sequence shard; backward all-gathers."""
    return _ReduceScatterSequence.apply(x, dim, tp) if tp.enabled else x
