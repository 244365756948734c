"""Every Triton kernel a fusion flag selects equals its torch reference, forward and backward, in
fp32 and bf16: on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1, set by
tests/conftest.py), and compiled on a GPU in the GPU tier (test_triton_compile.py compiles each
launch for a Hopper GPU without one). The model's fused modules take the kernel path exactly
where `use_triton` says, and a whole model with every flag on gives the loss and gradients of
the same model on the torch paths."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from megatron.model import fusions  # noqa: E402
from megatron.model.activations import bias_gelu, fused_swiglu  # noqa: E402
from megatron.model.config import ModelConfig  # noqa: E402
from megatron.model.gpt import GPTModel, lm_loss  # noqa: E402
from megatron.model.norms import FusedLayerNorm, FusedRMSNorm, RMSNorm  # noqa: E402
from megatron.model.positional import RotaryEmbedding  # noqa: E402

DEVICES = [pytest.param("cpu", id="cpu-interpreted"),
           pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture
def kernels(device):
    """The kernel module, running on `device` (the interpreter on CPU)."""
    if device == "cuda":
        yield fusions.triton_kernels()
        return
    with fusions.triton_on_cpu():
        yield fusions.triton_kernels()


def inputs(shape, dtype, device, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g)).to(device=device, dtype=dtype).requires_grad_()


def grads(fn, tensors, seed=1):
    """fn(*tensors) and the gradients of <out, fixed random weights> w.r.t. each tensor."""
    out = fn(*tensors)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.device)
    got = torch.autograd.grad((out.float() * weight).sum(), [t for t in tensors if t is not None])
    return out, got


def assert_close(kernel_out, torch_out, exact_out, dtype, what):
    """fp32: equal to torch's within rounding. bf16: no further from the fp32 computation on
    the same bf16 inputs than torch's bf16 result is, give or take one bf16 rounding."""
    kernel_out, torch_out, exact_out = kernel_out.float(), torch_out.float(), exact_out.float()
    if dtype == torch.float32:
        tol = 2e-5 * max(1.0, exact_out.abs().max().item())
        assert (kernel_out - torch_out).abs().max().item() <= tol, what
        return
    kernel_err = (kernel_out - exact_out).abs().max().item()
    torch_err = (torch_out - exact_out).abs().max().item()
    ulp = 2.0 ** -7 * exact_out.abs().max().item()
    assert kernel_err <= 2 * torch_err + ulp, (what, kernel_err, torch_err)


def compare(kernel_fn, torch_fn, tensors, dtype, what):
    out, got = grads(kernel_fn, tensors)
    ref, want = grads(torch_fn, tensors)
    exact = [t.detach().float().requires_grad_() if t is not None else None for t in tensors]
    ex, ex_grads = grads(torch_fn, exact)
    assert out.dtype == ref.dtype and out.shape == ref.shape, what
    assert_close(out, ref, ex, dtype, f"{what} forward")
    for i, (a, b, c) in enumerate(zip(got, want, ex_grads)):
        assert_close(a, b, c, dtype, f"{what} gradient {i}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rms,bias", [(False, True), (False, False), (True, False), (True, True)])
def test_norm_kernel_equals_torch(kernels, device, dtype, rms, bias):
    n = 96  # not a power of two: the masked tail of the row block is exercised
    x = inputs((3, 7, n), dtype, device, scale=3.0)
    w = (1 + 0.2 * inputs((n,), torch.float32, device, seed=2)).detach().to(dtype).requires_grad_()
    b = inputs((n,), dtype, device, seed=3) if bias else None

    def reference(x, w, b=None):
        if rms:
            xf = x.float()
            out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w
            return out + b if b is not None else out
        return F.layer_norm(x, (n,), w, b, 1e-5)

    compare(lambda x, w, b=None: kernels.norm(x, w, b, 1e-5, rms), reference,
            [x, w] + ([b] if bias else []), dtype, f"norm rms={rms} bias={bias}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,rotary_ndims,seq", [(16, 16, 5), (16, 4, 5), (24, 12, 5),
                                                        (128, 32, 37)])
def test_rotary_kernel_equals_torch_including_strided_queries(kernels, device, dtype, head_dim,
                                                               rotary_ndims, seq):
    """(128, 32, 37): GPT-NeoX 1-3B's heads; 222 rows in 7 programs of 32, the last one short."""
    rope = RotaryEmbedding(rotary_ndims, 10000.0, 128).to(device)
    positions = torch.stack([torch.arange(seq), torch.arange(seq) + 40]).to(device)  # offsets
    cos, sin = rope.cos_sin(positions)
    # a [b, s, heads, d] buffer seen as [b, heads, s, d], as attention hands queries over
    q = inputs((2, seq, 3, head_dim), dtype, device).detach().transpose(1, 2).requires_grad_()
    compare(lambda q: kernels.rotary(q, cos, sin), lambda q: rope.rotate(q, cos, sin), [q],
            dtype, f"rotary {rotary_ndims}/{head_dim}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["silu", "gelu", "relu"])
def test_gated_kernel_equals_torch(kernels, device, dtype, act):
    fn = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}[act]

    def reference(x):
        value, gate = x.chunk(2, dim=-1)
        return fn(gate) * value

    x = inputs((3, 4, 2 * 1100), dtype, device, scale=2.0)  # f = 1100 spans two blocks
    compare(lambda x: kernels.gated(x, act), reference, [x], dtype, f"gated {act}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_bias_gelu_kernel_is_tanh_gelu_of_x_plus_bias(kernels, device, dtype, bias):
    x = inputs((3, 5, 40), dtype, device, scale=2.0)
    b = inputs((40,), dtype, device, seed=4) if bias else None
    compare(lambda x, b=None: kernels.bias_gelu(x, b),
            lambda x, b=None: F.gelu((x + b) if b is not None else x, approximate="tanh"),
            [x] + ([b] if bias else []), dtype, "bias_gelu")


def test_tanh_gelu_is_gpt_neox_formula():
    """bias_gelu_fusion's function, written as GPT-NeoX writes it, is what the torch path runs."""
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    neox = x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
    assert torch.allclose(bias_gelu(x, None), neox, atol=1e-8)
    assert (bias_gelu(x, None) - F.gelu(x)).abs().max() > 1e-4  # not the erf GELU


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_dropout_add_kernel(kernels, device, dtype):
    """out = residual + mask * (x + bias) / (1 - p): the mask keeps about 1 - p, the backward
    uses the forward's mask, the same generator state gives the same mask and the next draw
    another."""
    p, shape = 0.3, (4, 64, 96)
    x, res = inputs(shape, dtype, device, seed=1), inputs(shape, dtype, device, seed=2)
    b = inputs((96,), dtype, device, seed=3)
    torch.manual_seed(7)
    out, (dx, db, dres) = grads(lambda x, b, r: kernels.bias_dropout_add(x, b, r, p), [x, b, res])
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    weight = weight.to(device=device, dtype=dtype).float()  # the gradient reaching the kernel
    keep = dx.float() != 0  # the backward's mask; the forward must have used the same one
    assert abs(keep.float().mean().item() - (1 - p)) < 0.02
    grad = keep * weight / (1 - p)
    assert_close(dx, grad.to(dtype), grad, dtype, "dx")
    expected = res.float() + keep * (x.float() + b.float()) / (1 - p)
    assert_close(out, expected.to(dtype), expected, dtype, "forward with the backward's mask")
    assert torch.equal(dres.float(), weight)
    assert_close(db, grad.sum((0, 1)).to(dtype), grad.sum((0, 1)), dtype, "dbias")
    torch.manual_seed(7)
    again = kernels.bias_dropout_add(x, b, res, p)
    assert torch.equal(again, out)
    assert not torch.equal(kernels.bias_dropout_add(x, b, res, p), out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1000, 4096, 9001])  # under one block, one, three (short last)
def test_cross_entropy_kernels_equal_the_blocked_torch_ops(device, dtype, vocab):
    """The cross entropy's Triton forward (one pass per token: running maximum and sum) and
    backward give the blocked torch code's loss and gradient, also for a masked vocabulary
    (-inf entries), a token whose logits are all -inf, a +inf logit and a NaN one."""
    from megatron.mpu.groups import NO_TP

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 9, vocab, generator=g) * 4
    logits[0, 1, vocab // 2:] = float("-inf")
    logits[0, 2] = float("-inf")
    logits[0, 3, 7] = float("inf")
    logits[0, 4, 5] = float("nan")
    logits = logits.to(device=device, dtype=dtype)
    labels = torch.randint(0, vocab, (2, 9), generator=g).to(device)
    labels[0, 1] = 0  # a label inside the unmasked half
    weight = torch.rand(2, 9, generator=g).to(device)
    ordinary = torch.ones(2, 9, dtype=torch.bool)
    ordinary[0, 2:5] = False

    def run(fused):  # the kernels on `device`; else the blocked torch code on CPU tensors
        on = device if fused else "cpu"
        x = logits.to(on).requires_grad_()
        context = fusions.triton_on_cpu() if fused and on == "cpu" else contextlib.nullcontext()
        with context:
            assert fusions.use_triton(x) == fused
            loss = fusions.cross_entropy(x, labels.to(on), NO_TP)
            (loss.nan_to_num(0.0, 0.0, 0.0) * weight.to(on)).sum().backward()
        return loss.detach().cpu(), x.grad.cpu()

    (loss, grad), (want, want_grad) = run(True), run(False)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=2e-5, equal_nan=True)
    # all -inf logits: -inf minus the -inf picked; a +inf logit: an infinite log-sum-exp
    assert math.isnan(loss[0, 2].item()) and math.isnan(loss[0, 4].item())
    assert loss[0, 3].item() == float("inf")
    exact = grad.float()[ordinary], want_grad.float()[ordinary]
    tol = 1e-6 if dtype == torch.float32 else 2.0 ** -7  # bf16: one rounding of |grad| < 1
    torch.testing.assert_close(*exact, rtol=tol, atol=tol)
    assert grad[0, 2].isnan().all() and want_grad[0, 2].isnan().all()


def test_compiled_code_calls_the_rotary_kernel_as_an_opaque_operator(monkeypatch):
    """Inside torch.compile (torch_compile: true) rope_fusion's kernel still runs, as the operator
    neox::rotary that inductor calls rather than rewrites: one graph (fullgraph), the kernel
    launched once forward and once backward, and the eager torch rotary's values."""
    kernels = fusions.triton_kernels()
    calls = []

    def counted(x, cos, sin, sign):
        calls.append(sign)
        return rotate(x, cos, sin, sign)

    rotate = kernels._rotate
    monkeypatch.setattr(kernels, "_rotate", counted)
    fused, plain = RotaryEmbedding(16, 10000.0, 64, fused=True), RotaryEmbedding(16, 1e4, 64)
    positions = torch.arange(7).expand(2, 7)

    def attend(rope, q):
        cos, sin = rope.cos_sin(positions)
        return rope.rotate(q, cos, sin) * 3.0

    q = inputs((2, 7, 4, 24), torch.float32, "cpu").detach().transpose(1, 2).requires_grad_()
    torch._dynamo.reset()
    with fusions.triton_on_cpu():
        out, (got,) = grads(torch.compile(lambda q: attend(fused, q), fullgraph=True), [q])
    assert calls == [-1, 1]  # forward, then backward (the opposite angle)
    ref, (want,) = grads(lambda q: attend(plain, q), [q])
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


def _vocab_parallel_kernels(rank, world):
    """One rank's slice of the vocabulary through the cross entropy's Triton kernels."""
    import torch.distributed as dist

    from megatron.mpu.groups import TensorParallel

    logits, labels = _tp_logits_and_labels()
    tp = TensorParallel(group=dist.group.WORLD, rank=rank, size=world)
    mine = logits.chunk(world, dim=-1)[rank].detach().requires_grad_()
    with fusions.triton_on_cpu():
        assert fusions.use_triton(mine)
        loss = fusions.cross_entropy(mine, labels, tp)
        (loss * torch.arange(1.0, 1.0 + loss.numel()).view(loss.shape)).sum().backward()
    return loss.detach(), mine.grad


def _tp_logits_and_labels():
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(3, 4, 2 * 4500, generator=g) * 4).bfloat16()  # two blocks a rank
    labels = torch.randint(0, 2 * 4500, (3, 4), generator=g)
    labels[0, :2] = torch.tensor([0, 2 * 4500 - 1])  # the first and last id: rank 0, rank 1
    return logits, labels


def test_the_cross_entropy_kernels_under_tensor_parallelism_equal_torchs():
    """Two gloo processes, each with half of a bf16 vocabulary: the per-token loss and each
    rank's slice of the gradient are torch's cross entropy on the whole fp32 logits."""
    from tests.distributed import run_distributed

    results = run_distributed(_vocab_parallel_kernels, 2)
    logits, labels = _tp_logits_and_labels()
    full = logits.float().requires_grad_()
    want = F.cross_entropy(full.flatten(0, 1), labels.flatten(), reduction="none").view(3, 4)
    (want * torch.arange(1.0, 13.0).view(3, 4)).sum().backward()
    for rank, (loss, grad) in enumerate(results):
        torch.testing.assert_close(loss, want.detach(), rtol=1e-6, atol=2e-5)
        assert grad.dtype == torch.bfloat16
        torch.testing.assert_close(grad.float(), full.grad.chunk(2, dim=-1)[rank],
                                   rtol=2.0 ** -7, atol=2.0 ** -7 * 12)


@pytest.mark.parametrize("device", DEVICES)
def test_modules_take_the_kernel_exactly_where_use_triton_says(device):
    x = torch.randn(2, 3, 32, device=device)
    with torch.device(device):
        modules = {"_NormBackward": [FusedRMSNorm(32, 1e-5), FusedLayerNorm(32)],
                   "_RotaryBackward": [lambda x: RotaryEmbedding(8, 10000.0, 8, fused=True).to(
                       device).rotate(x.unsqueeze(1), *RotaryEmbedding(8, 1e4, 8).to(device)
                       .cos_sin(torch.arange(3, device=device).expand(2, 3)))],
                   "_GatedBackward": [fused_swiglu],
                   "_BiasGeluBackward": [lambda x: bias_gelu(x, torch.zeros(32, device=device))]}
    xg = x.clone().requires_grad_()
    context = fusions.triton_on_cpu() if device == "cpu" else torch.enable_grad()
    with context:
        assert fusions.use_triton(xg)
        for backward, fns in modules.items():
            for fn in fns:
                assert type(fn(xg).grad_fn).__name__ == backward
    if device == "cpu":  # outside the context: the torch code
        assert not fusions.use_triton(xg)
        assert FusedRMSNorm(32, 1e-5)(xg).grad_fn.name() != "_NormBackward"
        assert torch.allclose(FusedRMSNorm(32, 1e-5)(x), RMSNorm(32, 1e-5)(x), atol=1e-6)


def model_config(**overrides) -> ModelConfig:
    base = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_kv_heads=4,
                intermediate_size=64, seq_length=8, max_position_embeddings=16,
                padded_vocab_size=64, rotary_pct=0.5)
    base.update(overrides)
    return ModelConfig(**base)


ALL_FLAGS = dict(layernorm_fusion=True, rmsnorm_fusion=True, rope_fusion=True,
                 bias_gelu_fusion=True, bias_dropout_fusion=True, use_flashattn_swiglu=True)
ARCHITECTURES = {"neox": {}, "llama": dict(norm="rmsnorm", activation="swiglu")}


def loss_and_grads(config, device, kernels_on: bool, seed=0):
    torch.manual_seed(seed)
    model = GPTModel(config).to(device).train()
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 64, (2, 8), generator=g).to(device)
    labels = torch.randint(0, 64, (2, 8), generator=g).to(device)
    context = fusions.triton_on_cpu() if kernels_on and device == "cpu" else torch.enable_grad()
    with context:
        assert fusions.use_triton(tokens.float()) == (kernels_on or device == "cuda")
        loss = lm_loss(model(tokens, torch.arange(8, device=device).expand(2, 8)),
                       (labels, torch.ones(2, 8, device=device)))
        loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_model_with_every_flag_equals_its_torch_paths(arch, device):
    """On CPU: kernels interpreted against the torch paths; on a GPU: compiled kernels against
    the torch paths on the CPU (the same weights and batch)."""
    config = model_config(**ARCHITECTURES[arch], **ALL_FLAGS)
    loss, grads_ = loss_and_grads(config, device, kernels_on=True)
    grads_ = {name: grad.cpu() for name, grad in grads_.items()}
    ref_loss, ref_grads = loss_and_grads(config, "cpu", kernels_on=False)
    tol = 1e-5 if device == "cpu" else 1e-4  # another device's reduction order
    assert abs(loss - ref_loss) < tol
    for name, grad in ref_grads.items():
        assert torch.allclose(grads_[name], grad, atol=tol), name
    assert abs(loss - math.log(64)) < 0.5


def test_bias_gelu_fusion_changes_the_function_as_in_gpt_neox():
    """With the flag the MLP's GELU is the tanh approximation on every path, so the flag is
    part of the architecture; without it, the erf GELU."""
    erf = model_config(init_method_std=0.5)  # pre-activations of order 1, where the two differ
    tanh = dataclasses.replace(erf, bias_gelu_fusion=True)
    a, _ = loss_and_grads(erf, "cpu", kernels_on=False)
    b, _ = loss_and_grads(tanh, "cpu", kernels_on=False)
    assert 1e-6 < abs(a - b) < 1e-2
    assert (erf.gelu_approximation, tanh.gelu_approximation) == ("none", "tanh")
    assert dataclasses.replace(tanh, activation="swiglu").gelu_approximation == "none"


def test_fused_dropout_model_trains_reproducibly():
    config = model_config(hidden_dropout=0.5, **ALL_FLAGS)
    first, _ = loss_and_grads(config, "cpu", kernels_on=True, seed=1)
    again, _ = loss_and_grads(config, "cpu", kernels_on=True, seed=1)
    other, _ = loss_and_grads(config, "cpu", kernels_on=True, seed=2)
    without, _ = loss_and_grads(dataclasses.replace(config, hidden_dropout=0.0), "cpu",
                                kernels_on=True, seed=1)
    assert first == again
    assert first != without and other != first
