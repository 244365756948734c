"""The blocked causal attention for CPU tensors against the attention written out in fp64:
forward and the three gradients, grouped-query heads, lengths that are not a multiple of the
block, what it saves for the backward, and which calls it takes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from megatron.model import attention_impls, cpu_attention
from megatron.model.attention_impls import reference_attention, sdpa_attention


def _attend(fn, q, k, v, grad, dtype):
    """fn's output and the gradients of q, k, v, in fp64, from inputs cast to `dtype`."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(grad.to(dtype))
    return [out.double()] + [t.grad.double() for t in leaves]


def _inputs(shape, seed):
    """q, k, v and the output's gradient in fp64, and the fp64 reference's results."""
    b, h, kv, s, d = shape
    gen = torch.Generator().manual_seed(seed)
    q, grad = (torch.randn(b, h, s, d, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(b, kv, s, d, generator=gen, dtype=torch.float64) for _ in range(2))
    want = _attend(lambda *t: reference_attention(*t, None, 0.0, True), q, k, v, grad,
                   torch.float64)
    return (q, k, v, grad), want


def _errors(got, want):
    return [((g - w).abs().max() / w.abs().max()).item() for g, w in zip(got, want)]


SHAPES = [  # b, heads, kv heads, s, d
    (2, 4, 4, 100, 16),    # under two blocks, the second one short
    (1, 4, 4, 64, 8),      # exactly one block
    (2, 8, 2, 200, 32),    # grouped-query: 4 query heads per key head, four blocks
    (1, 6, 1, 130, 16),    # one key head for all (multi-query), three blocks
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-h{}-kv{}-s{}-d{}".format(*s))
def test_fp32_matches_the_written_out_attention(shape):
    (q, k, v, grad), want = _inputs(shape, seed=0)
    got = _attend(cpu_attention.blocked_causal_attention, q, k, v, grad, torch.float32)
    assert max(_errors(got, want)) < 2e-6


@pytest.mark.parametrize("shape", SHAPES[::2], ids=lambda s: "b{}-h{}-kv{}-s{}-d{}".format(*s))
def test_bf16_is_as_close_to_fp64_as_torch_sdpa(shape):
    """In bf16 every result is compared with fp64 and must be within twice the error of torch
    SDPA given the same bf16 inputs (the products round to bf16 in both)."""
    (q, k, v, grad), want = _inputs(shape, seed=1)
    gqa = shape[2] != shape[1]
    sdpa = _errors(_attend(lambda q_, k_, v_: F.scaled_dot_product_attention(
        q_, k_, v_, is_causal=True, enable_gqa=gqa), q, k, v, grad, torch.bfloat16), want)
    ours = _errors(_attend(cpu_attention.blocked_causal_attention, q, k, v, grad,
                           torch.bfloat16), want)
    assert all(o < 2 * e + 1e-3 for o, e in zip(ours, sdpa)), (ours, sdpa)
    assert max(ours) < 2e-2


def test_a_query_never_sees_a_later_key():
    """Changing the keys and values after position 70 leaves the outputs up to 70 as they
    were (the mask holds inside a block and across blocks)."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 150, 8, generator=gen) for _ in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 71:] += 5.0
    v2[:, :, 71:] -= 3.0
    a = cpu_attention.blocked_causal_attention(q, k, v)
    b = cpu_attention.blocked_causal_attention(q, k2, v2)
    assert torch.equal(a[:, :, :71], b[:, :, :71])
    assert not torch.allclose(a[:, :, 71:], b[:, :, 71:])


def test_the_backward_keeps_q_k_v_and_only_the_causal_blocks_of_the_probabilities():
    """The forward's probabilities are kept for the backward, in its blocks: each block of
    queries over the keys up to its last position, not the [s, s] matrix that GPT-NeoX's
    unfused attention keeps (the part above the diagonal blocks is never stored)."""
    b, h, s, d = 2, 4, 200, 16  # the last block short: 200 = 3 x 64 + 8
    q, k, v = (torch.randn(b, h, s, d, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        cpu_attention.blocked_causal_attention(q, k, v)
    from megatron.model.cpu_attention_blocks import kept_probabilities

    ends = [64, 128, 192, 200]  # each block's last key + 1
    blocks = [b * h * (end - start) * end for start, end in zip([0, 64, 128, 192], ends)]
    assert [t.numel() for t in saved] == [q.numel()] * 3 + blocks
    assert sum(blocks) == b * h * kept_probabilities(s)  # what the memory estimate counts
    assert sum(blocks) < 0.7 * b * h * s * s  # 0.56 of it at 512 positions
    assert all(t.dtype == torch.bfloat16 for t in saved)


def test_sdpa_attention_takes_it_for_plain_causal_cpu_bf16_and_fp32_attention_only():
    q, k, v = (torch.randn(1, 2, 32, 8, dtype=torch.bfloat16) for _ in range(3))
    keep = torch.ones(32, 32, dtype=torch.bool).tril()
    assert cpu_attention.supports(q, k, None, 0.0)
    assert not cpu_attention.supports(q, k, keep, 0.0)  # a mask: windows, documents, ALiBi
    assert not cpu_attention.supports(q, k, None, 0.1)  # attention dropout
    assert not cpu_attention.supports(q, k[:, :, :16], None, 0.0)  # a cache's keys
    assert cpu_attention.supports(q.float(), k.float(), None, 0.0)
    assert not cpu_attention.supports(q.double(), k.double(), None, 0.0)
    assert not cpu_attention.supports(q.half(), k.half(), None, 0.0)
    long = torch.randn(1, 2, cpu_attention.MAX_POSITIONS + 1, 8, dtype=torch.bfloat16)
    assert cpu_attention.supports(long[:, :, 1:], long[:, :, 1:], None, 0.0)
    assert not cpu_attention.supports(long, long, None, 0.0)  # SDPA is faster there
    q.requires_grad_()
    out = sdpa_attention(q, k, v, None, 0.0, True)
    assert type(out.grad_fn).__name__ == "_BlockedCausalAttentionBackward"
    out = sdpa_attention(q, k, v, keep, 0.0, True)
    assert "Blocked" not in type(out.grad_fn).__name__
    torch.testing.assert_close(out, sdpa_attention(q, k, v, None, 0.0, True), atol=2e-2, rtol=2e-2)


def test_the_first_use_is_logged_once(monkeypatch, caplog):
    import logging

    monkeypatch.setattr(attention_impls, "_LOGGED", set())
    q, k, v = (torch.randn(1, 2, 16, 8, dtype=torch.bfloat16) for _ in range(3))
    with caplog.at_level(logging.INFO, logger="megatron"):
        sdpa_attention(q, k, v, None, 0.0, True)
        sdpa_attention(q, k, v, None, 0.0, True)
    lines = [r.getMessage() for r in caplog.records if "blocks of" in r.getMessage()]
    assert lines == [cpu_attention.PATH_LINE]


def test_the_bench_times_both_kernels_and_names_the_one_the_model_calls(capsys):
    """`python bench/attention.py` runs both kernels through the model's output reshape and
    says which one the model uses for each shape and dtype."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "attention.py"
    spec = importlib.util.spec_from_file_location("bench_attention", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--shapes", "1,2,70,8", "1,2,800,8", "--dtypes", "bf16", "fp32",
                       "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split(":")[0] for line in lines] == [
        "b1 h2 s70 d8 bf16", "b1 h2 s70 d8 fp32", "b1 h2 s800 d8 bf16", "b1 h2 s800 d8 fp32"]
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["ours", "ours", "SDPA", "SDPA"]
    assert all("SDPA/ours" in line for line in lines)
