"""Expert parallelism's token exchange on 2 real gloo processes, each with its own tokens and
half of 4 experts: every assignment's output, the gradient of every input row and of every
expert's weights equal one process holding all experts and both ranks' tokens."""

import pytest
import torch
import torch.nn.functional as F

from megatron.model.moe_dispatch import expert_major_order, exchange_and_compute
from tests.distributed import run_distributed

E, H, FFN = 4, 8, 12


def weights():
    g = torch.Generator().manual_seed(0)
    return torch.randn(E, FFN, H, generator=g), torch.randn(E, H, FFN, generator=g)


def tokens(rank: int):
    """Rank `rank`'s assignments sorted by expert, (rows, counts, upstream gradient); expert 3
    gets none from rank 1."""
    g = torch.Generator().manual_seed(10 + rank)
    counts = [[3, 0, 5, 2], [4, 6, 1, 0]][rank]
    rows = torch.randn(sum(counts), H, generator=g)
    return rows, counts, torch.randn(sum(counts), H, generator=g)


def run_experts(rows, counts, w_in, w_out):
    return torch.cat([F.linear(F.gelu(F.linear(r, w_in[e])), w_out[e])
                      for e, r in enumerate(rows.split(counts))])


def _exchange(rank, world):
    full_in, full_out = weights()
    local = slice(rank * E // world, (rank + 1) * E // world)
    w_in = full_in[local].clone().requires_grad_()
    w_out = full_out[local].clone().requires_grad_()
    rows, counts, grad = tokens(rank)
    rows.requires_grad_()
    out = exchange_and_compute(rows, counts, lambda x, c: run_experts(x, c, w_in, w_out))
    out.backward(grad)
    return out.detach(), rows.grad, w_in.grad, w_out.grad


def test_exchanged_experts_equal_one_process_holding_them_all():
    results = run_distributed(_exchange, 2)
    full_in, full_out = (w.requires_grad_() for w in weights())
    want_in, want_out = torch.zeros_like(full_in), torch.zeros_like(full_out)
    for rank, (out, rows_grad, w_in_grad, w_out_grad) in enumerate(results):
        rows, counts, grad = tokens(rank)
        rows.requires_grad_()
        expected = run_experts(rows, counts, full_in, full_out)
        torch.testing.assert_close(out, expected.detach(), rtol=1e-6, atol=1e-6)
        g_rows, g_in, g_out = torch.autograd.grad(expected, (rows, full_in, full_out), grad)
        torch.testing.assert_close(rows_grad, g_rows, rtol=1e-6, atol=1e-6)
        want_in, want_out = want_in + g_in, want_out + g_out
    # each rank's experts collect the gradient of both ranks' tokens
    for rank, (*_, w_in_grad, w_out_grad) in enumerate(results):
        local = slice(rank * 2, rank * 2 + 2)
        torch.testing.assert_close(w_in_grad, want_in[local], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(w_out_grad, want_out[local], rtol=1e-5, atol=1e-6)


def test_expert_major_order_regroups_source_blocks():
    counts = torch.tensor([[2, 1], [0, 3]])  # source 0: e0 x2, e1 x1; source 1: e1 x3
    # rows: s0e0 = 0, 1; s0e1 = 2; s1e1 = 3, 4, 5
    assert expert_major_order(counts).tolist() == [0, 1, 2, 3, 4, 5]
    counts = torch.tensor([[1, 2], [3, 1]])  # rows: s0e0 0; s0e1 1, 2; s1e0 3, 4, 5; s1e1 6
    assert expert_major_order(counts).tolist() == [0, 3, 4, 5, 1, 2, 6]


def _refused(rank, world):
    with pytest.raises(ValueError) as err:
        exchange_and_compute(torch.zeros(3, H), [1, 1, 1], lambda x, c: x)
    return str(err.value)


def test_experts_that_do_not_split_over_the_group_are_refused():
    assert run_distributed(_refused, 2) == ["3 experts do not split over 2 expert-parallel "
                                            "ranks"] * 2
