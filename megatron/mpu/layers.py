"""Tensor-parallel layers: vocab-parallel embedding, column- and row-parallel linear.

Each layer initialises the FULL weight from the caller's generator and keeps its own shard, so
the same seed gives the same model whatever the tensor-parallel size. With size 1 they are
plain embedding / linear layers and communicate nothing.

Parameters whose gradient is computed from this rank's sequence shard only (sequence
parallelism) carry `sequence_parallel_grad = True`; `sync_sequence_parallel_grads` all-reduces
their gradients over the tensor-parallel group.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.mappings import (all_reduce_sum, copy_to_tensor_parallel,
                                   gather_from_sequence_parallel, reduce_from_tensor_parallel,
                                   reduce_scatter_to_sequence_parallel)
from megatron.mpu.products import linear

InitFn = Callable[[torch.Tensor, torch.Generator], None]


def shard(full: torch.Tensor, dim: int, tp: TensorParallel, stride_groups: int = 1) -> torch.Tensor:
    """This rank's part of `full` along `dim`. With stride_groups k the dimension is k blocks
    laid end to end (e.g. [value; gate] of a gated MLP) and each block is split separately."""
    if full.shape[dim] % (tp.size * stride_groups):
        raise ValueError(f"size {full.shape[dim]} along dim {dim} does not split into "
                         f"{stride_groups} block(s) x {tp.size} tensor-parallel parts")
    blocks = full.chunk(stride_groups, dim=dim)
    return torch.cat([b.chunk(tp.size, dim=dim)[tp.rank] for b in blocks], dim=dim).contiguous()


def merge_shards(shards: list[torch.Tensor], dim: int, stride_groups: int = 1) -> torch.Tensor:
    """Inverse of `shard`: the full tensor from every rank's part, in rank order."""
    per_rank = [s.chunk(stride_groups, dim=dim) for s in shards]
    return torch.cat([torch.cat([p[g] for p in per_rank], dim=dim) for g in range(stride_groups)],
                     dim=dim)


def _mark_sharded(*params) -> None:
    """Flag tensor-parallel shards the way DeepSpeed's norm and ZeRO code recognise them."""
    for p in params:
        if p is not None:
            p.tensor_model_parallel = True


def _init_full(shape: tuple[int, ...], init_fn: InitFn, gen: torch.Generator) -> torch.Tensor:
    full = torch.empty(shape)
    init_fn(full, gen)
    return full


class VocabParallelEmbedding(nn.Module):
    """Embedding whose vocabulary rows are split over tensor-parallel ranks."""

    def __init__(self, vocab_size: int, dim: int, init_fn: InitFn, gen: torch.Generator,
                 tp: TensorParallel = NO_TP):
        super().__init__()
        self.tp = tp
        if vocab_size % tp.size:
            raise ValueError(f"padded vocab size {vocab_size} is not divisible by "
                             f"model_parallel_size {tp.size}")
        self.per_rank = vocab_size // tp.size
        self.start = tp.rank * self.per_rank
        self.weight = nn.Parameter(shard(_init_full((vocab_size, dim), init_fn, gen), 0, tp))
        if tp.enabled:
            _mark_sharded(self.weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self.tp.enabled:
            return F.embedding(tokens, self.weight)
        outside = (tokens < self.start) | (tokens >= self.start + self.per_rank)
        local = (tokens - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)  # [b, s, h]
        if self.tp.sequence_parallel:
            return reduce_scatter_to_sequence_parallel(out, self.tp)  # [b, s/tp, h]
        return reduce_from_tensor_parallel(out, self.tp)


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's output rows (and b) split over ranks; y stays split.

    Input [b, s, in] (or the sequence shard [b, s/tp, in] with sequence parallelism, gathered
    here); output [b, s, out/tp].
    """

    def __init__(self, in_features: int, out_features: int, init_fn: InitFn, gen: torch.Generator,
                 tp: TensorParallel = NO_TP, bias: bool = True, stride_groups: int = 1,
                 fp32_products: bool = False):
        super().__init__()
        self.tp = tp
        self.fp32_products = fp32_products  # bf16/fp16 CPU products in fp32 (products.py)
        full = _init_full((out_features, in_features), init_fn, gen)
        self.weight = nn.Parameter(shard(full, 0, tp, stride_groups))
        self.bias = nn.Parameter(torch.zeros(out_features // tp.size)) if bias else None
        if tp.enabled:
            _mark_sharded(self.weight, self.bias)

    def forward(self, x: torch.Tensor, add_bias: bool = True) -> torch.Tensor:
        """x W^T + b; with add_bias=False the caller adds `self.bias` (a fused kernel)."""
        if self.tp.sequence_parallel:
            x = gather_from_sequence_parallel(x, self.tp)
        else:
            x = copy_to_tensor_parallel(x, self.tp)
        return linear(x, self.weight, self.bias if add_bias else None, self.fp32_products)


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W's input columns split over ranks: partial sums are reduced (or
    reduce-scattered along the sequence with sequence parallelism); b is added once after."""

    def __init__(self, in_features: int, out_features: int, init_fn: InitFn, gen: torch.Generator,
                 tp: TensorParallel = NO_TP, bias: bool = True, fp32_products: bool = False):
        super().__init__()
        self.tp = tp
        self.fp32_products = fp32_products  # bf16/fp16 CPU products in fp32 (products.py)
        full = _init_full((out_features, in_features), init_fn, gen)
        self.weight = nn.Parameter(shard(full, 1, tp))
        if tp.enabled:
            _mark_sharded(self.weight)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        if self.bias is not None and tp.sequence_parallel:
            self.bias.sequence_parallel_grad = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, fp32=self.fp32_products)
        if self.tp.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel(y, self.tp)
        else:
            y = reduce_from_tensor_parallel(y, self.tp)
        return y + self.bias if self.bias is not None else y


def mark_sequence_parallel(module: nn.Module, tp: TensorParallel) -> None:
    """Flag every parameter of `module` (a norm, say) as computed from sequence shards."""
    if tp.sequence_parallel:
        for p in module.parameters():
            p.sequence_parallel_grad = True


def sync_sequence_parallel_grads(model: nn.Module, tp: TensorParallel) -> int:
    """All-reduce, over the tensor-parallel group, the gradients of flagged parameters during
    backward; returns how many parameters were hooked."""
    if not tp.sequence_parallel:
        return 0
    count = 0
    for p in model.parameters():
        if getattr(p, "sequence_parallel_grad", False):
            p.register_hook(lambda grad: all_reduce_sum(grad.clone(), tp))
            count += 1
    return count
