"""The blocked cross entropy (megatron/mpu/cross_entropy.py) against torch's on one process:
the same loss and gradient in fp32 and from bf16 logits, and no fp32 tensor of the whole
[tokens, vocabulary] size is ever made. Under tensor parallelism: tests/mpu/test_layers.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.mpu.cross_entropy import vocab_parallel_cross_entropy
from megatron.mpu.groups import NO_TP

B, S, V = 3, 5, 1000  # 15 tokens


def logits_and_labels(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(B, S, V, generator=g) * 4).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (B, S), generator=g)
    return logits, labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_rows", [1, 4, 100])  # one token a block, uneven blocks, one block
def test_loss_and_gradient_equal_torchs_cross_entropy_in_fp32(dtype, block_rows):
    logits, labels = logits_and_labels(dtype)
    weights = torch.rand(B, S, generator=torch.Generator().manual_seed(1))
    got = vocab_parallel_cross_entropy(logits, labels, NO_TP, block_elements=block_rows * V)
    (got * weights).sum().backward()
    got_grad, logits.grad = logits.grad, None
    want = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(),
                           reduction="none").view(B, S)
    (want * weights).sum().backward()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    assert got_grad.dtype == dtype
    torch.testing.assert_close(got_grad, logits.grad, rtol=1e-6, atol=1e-6)


def test_without_fp32_the_loss_is_computed_in_the_logits_dtype():
    logits, labels = logits_and_labels(torch.bfloat16)
    got = vocab_parallel_cross_entropy(logits, labels, NO_TP, fp32=False)
    want = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.view(B, S), rtol=2e-2, atol=5e-2)


class LargestFloat32(TorchDispatchMode):
    """The most elements of any fp32 tensor an op returns while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


def test_no_fp32_tensor_of_the_whole_vocabulary_is_made_from_bf16_logits():
    logits, labels = logits_and_labels(torch.bfloat16)
    with LargestFloat32() as seen:
        vocab_parallel_cross_entropy(logits, labels, NO_TP, block_elements=4 * V).sum().backward()
    assert seen.largest <= 4 * V
    logits.grad = None
    with LargestFloat32() as plain:  # what torch's cross entropy on fp32 logits makes
        F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()).backward()
    assert plain.largest == B * S * V


def test_on_a_cpu_forward_and_backward_work_in_cache_sized_blocks():
    """CPU tensors take blocks of LSE_BLOCK_ELEMENTS (4 MiB of fp32) both ways, whatever the
    block asked for: a 64-token x 50,304 bf16 step makes no fp32 tensor larger (the default
    2^24-value blocks would make one of all 3.2M)."""
    from megatron.mpu.cross_entropy import LSE_BLOCK_ELEMENTS

    logits = torch.randn(64, 50_304, generator=torch.Generator().manual_seed(0))
    logits = logits.bfloat16().requires_grad_()
    labels = torch.randint(0, 50_304, (64,), generator=torch.Generator().manual_seed(1))
    with LargestFloat32() as seen:
        loss = vocab_parallel_cross_entropy(logits, labels, NO_TP)
        loss.sum().backward()
    assert seen.largest == (LSE_BLOCK_ELEMENTS // 50_304) * 50_304  # 20 tokens a block
    torch.testing.assert_close(loss, F.cross_entropy(logits.float(), labels, reduction="none"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocked_log_sum_exp_equals_torchs_with_masked_and_infinite_rows(dtype):
    """The forward's own log-sum-exp (small blocks through one buffer): torch.logsumexp's value
    on ordinary rows, rows with -inf entries (a masked vocabulary) and a row all -inf."""
    from megatron.mpu.cross_entropy import _logsumexp

    flat = (torch.randn(7, V, generator=torch.Generator().manual_seed(2)) * 8).to(dtype)
    flat[1, 500:] = float("-inf")
    flat[4] = float("-inf")
    for rows in (1, 3, 7):
        got = _logsumexp(flat, torch.float32, rows * V)
        torch.testing.assert_close(got, torch.logsumexp(flat.float(), dim=-1), rtol=1e-6,
                                   atol=1e-5)
    assert got[4].item() == float("-inf")


class OpCount(TorchDispatchMode):
    """How many ops (kernels, on a GPU) run while active."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device, most", [("meta", 2_000), ("cpu", 20_000)])
def test_a_gpt2_sized_step_dispatches_hundreds_of_ops_off_the_cpu(device, most):
    """16,384 tokens x 50,304 logits (the 125M config at micro batch 8, seq 2048). On a CPU the
    forward's log-sum-exp goes through cache-sized blocks: about 800, some 15,000 ops. Any
    other device takes the full 2^24-value blocks, about 50 of them, where the Triton kernels
    do not run (a GPU without `triton`, or with fp32 false); on a GPU each op is a kernel
    launch, and the small blocks would cost more launches than the step's whole model. The
    meta device stands in for such a GPU here: no data, the same ops."""
    tokens, vocab = 16_384, 50_304
    logits = torch.empty(tokens, vocab, dtype=torch.bfloat16, device=device)
    if device == "cpu":  # the count depends on shapes only; small values keep exp finite
        logits.zero_()
    labels = torch.zeros(tokens, dtype=torch.long, device=device)
    with OpCount() as forward:
        vocab_parallel_cross_entropy(logits, labels, NO_TP)
    assert forward.ops <= most
    if device == "meta":
        assert forward.ops >= 50 * 5  # one pass of a few ops per block: the blocks are real
    else:
        assert forward.ops > 5_000
