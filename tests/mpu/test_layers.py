"""Tensor-parallel layers on 2 real gloo processes against nn.Embedding / nn.Linear /
cross_entropy on one process: forward outputs and the gradients of inputs and weights."""

import torch
import torch.nn.functional as F

from megatron.model.activations import ACTIVATIONS
from megatron.mpu.cross_entropy import vocab_parallel_cross_entropy
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.layers import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                 merge_shards, shard, sync_sequence_parallel_grads)
from megatron.mpu.mappings import gather_from_tensor_parallel
from tests.distributed import run_distributed

ATOL = 1e-5  # fp32; only the order of additions differs between layouts


def normal_init(t, gen):
    with torch.no_grad():
        t.copy_(torch.randn(t.shape, generator=gen))


def gen():
    return torch.Generator().manual_seed(11)


def tp_view(rank, world, sequence_parallel=False):
    import torch.distributed as dist

    return TensorParallel(group=dist.group.WORLD, rank=rank, size=world,
                          sequence_parallel=sequence_parallel)


def _layers(rank, world, sequence_parallel):
    tp = tp_view(rank, world, sequence_parallel)
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8)  # [b, s, h], the same on every rank
    tokens = torch.randint(0, 16, (2, 4))
    labels = torch.randint(0, 16, (2, 4))
    out = {}
    # embedding -> column (gated stride) -> row -> column head -> vocab-parallel CE
    emb = VocabParallelEmbedding(16, 8, normal_init, gen(), tp)
    col = ColumnParallelLinear(8, 24, normal_init, gen(), tp, stride_groups=2)  # [value; gate]
    row = RowParallelLinear(12, 8, normal_init, gen(), tp)
    head = ColumnParallelLinear(8, 16, normal_init, gen(), tp, bias=False)
    with torch.no_grad():  # non-zero biases: the full bias, sharded like the weight
        col.bias.copy_(shard(torch.arange(24, dtype=torch.float) / 10, 0, tp, 2))
        row.bias.copy_(torch.arange(8, dtype=torch.float) / 10)
    hooked = sync_sequence_parallel_grads(torch.nn.ModuleList([emb, col, row, head]), tp)
    xin = x.clone().requires_grad_()
    if sequence_parallel:
        xin_local = xin.chunk(world, dim=1)[rank]
    else:
        xin_local = xin
    h = emb(tokens) + xin_local
    y = row(ACTIVATIONS["swiglu"](col(h)))
    logits = head(y)
    loss = vocab_parallel_cross_entropy(logits, labels, tp).mean()
    loss.backward()
    out["loss"] = loss.detach()
    out["logits"] = gather_from_tensor_parallel(logits.detach(), tp)
    out["x_grad"] = xin.grad
    out["grads"] = {n: p.grad for n, p in [("emb", emb.weight), ("col", col.weight), ("col_b", col.bias),
                                           ("row", row.weight), ("row_b", row.bias), ("head", head.weight)]}
    out["hooked"] = hooked
    return out


def _layers_single():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8)
    tokens = torch.randint(0, 16, (2, 4))
    labels = torch.randint(0, 16, (2, 4))
    emb = torch.nn.Embedding(16, 8)
    col, row, head = torch.nn.Linear(8, 24), torch.nn.Linear(12, 8), torch.nn.Linear(8, 16, bias=False)
    for m in (emb, col, row, head):
        normal_init(m.weight, gen())
    for m in (col, row):
        with torch.no_grad():
            m.bias.copy_(torch.arange(m.bias.numel(), dtype=torch.float) / 10)
    xin = x.clone().requires_grad_()
    y = row(ACTIVATIONS["swiglu"](col(emb(tokens) + xin)))
    logits = head(y)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    loss.backward()
    return {"loss": loss.detach(), "logits": logits.detach(), "x_grad": xin.grad,
            "grads": {"emb": emb.weight.grad, "col": col.weight.grad, "col_b": col.bias.grad,
                      "row": row.weight.grad, "row_b": row.bias.grad, "head": head.weight.grad}}


def _check(results, ref, world, sequence_parallel):
    gated_split = {"col": (0, 2), "col_b": (0, 2), "emb": (0, 1), "head": (0, 1), "row": (1, 1)}
    for rank, got in enumerate(results):
        assert torch.allclose(got["loss"], ref["loss"], atol=ATOL), rank
        assert torch.allclose(got["logits"], ref["logits"], atol=ATOL), rank
        if not sequence_parallel:
            assert torch.allclose(got["x_grad"], ref["x_grad"], atol=ATOL), rank
        assert torch.allclose(got["grads"]["row_b"], ref["grads"]["row_b"], atol=ATOL), rank
    for name, (dim, groups) in gated_split.items():
        merged = merge_shards([r["grads"][name] for r in results], dim, groups)
        assert torch.allclose(merged, ref["grads"][name], atol=ATOL), name
    if sequence_parallel:
        # each rank back-propagates into its own sequence shard of the input only
        assert torch.allclose(sum(r["x_grad"] for r in results), ref["x_grad"], atol=ATOL)
        assert results[0]["hooked"] == 1  # the row-parallel bias sums grads over sequence shards


def test_tensor_parallel_layers_match_plain_layers_forward_and_backward():
    results = run_distributed(_layers, 2, False)
    _check(results, _layers_single(), 2, False)


def test_sequence_parallel_layers_match_plain_layers():
    results = run_distributed(_layers, 2, True)
    _check(results, _layers_single(), 2, True)


def test_shard_and_merge_round_trip_with_stride_groups():
    full = torch.arange(48.0).view(12, 4)
    for groups in (1, 2):
        parts = [shard(full, 0, TensorParallel(rank=r, size=3), groups) for r in range(3)]
        assert torch.equal(merge_shards(parts, 0, groups), full)
    # a gated [value; gate] weight: rank 0 gets the first half of each block
    parts = [shard(full, 0, TensorParallel(rank=r, size=2), 2) for r in range(2)]
    assert torch.equal(parts[0], torch.cat([full[0:3], full[6:9]]))


def test_vocab_parallel_cross_entropy_size_one_is_cross_entropy():
    logits, labels = torch.randn(2, 3, 7), torch.randint(0, 7, (2, 3))
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(2, 3)
    assert torch.allclose(vocab_parallel_cross_entropy(logits, labels, NO_TP), expected)


def _bf16_sums(rank, world):
    import torch.distributed as dist

    from megatron.mpu.mappings import reduce_from_tensor_parallel

    g = torch.Generator().manual_seed(100 + rank)
    x = (torch.randn(4096, generator=g) * 10.0 ** torch.randint(-3, 3, (4096,), generator=g)
         ).bfloat16()
    out = {"mine": x}
    for fp32 in (False, True):
        tp = TensorParallel(group=dist.group.WORLD, rank=rank, size=world, fp32_reduce=fp32)
        y = x.clone().requires_grad_()
        summed = reduce_from_tensor_parallel(y, tp)
        summed.backward(torch.ones_like(summed))
        out[fp32] = summed.detach()
        assert summed.dtype == torch.bfloat16 and torch.equal(y.grad, torch.ones_like(x))
    return out


def test_fp32_allreduce_sums_bf16_activations_in_fp32_over_the_tensor_parallel_group():
    """fp32_allreduce (GPT-NeoX's: its tensor-parallel reductions upcast to fp32): the sum of 4
    ranks' bf16 values is their fp32 sum rounded to bf16 once, on every rank; without it gloo
    sums in bf16, rounding after each partial sum, which here gives other values."""
    results = run_distributed(_bf16_sums, 4)
    exact = sum(r["mine"].float() for r in results).bfloat16()
    for r in results:
        assert torch.equal(r[True], exact)
    assert not torch.equal(results[0][False], exact)
