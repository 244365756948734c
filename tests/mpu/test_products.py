"""bf16/fp16 products on CPU tensors run in fp32 (cpu_matmul_precision): equal to the fp32
product rounded once, gradients included, keeping only low-precision tensors for the backward."""

import pytest
import torch
import torch.nn.functional as F

from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel
from megatron.mpu import products
from megatron.mpu.products import describe, fp32_products, linear


def _operands(dtype, bias=True):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 96, generator=gen).to(dtype).requires_grad_()
    w = torch.randn(40, 96, generator=gen).to(dtype).requires_grad_()
    b = torch.randn(40, generator=gen).to(dtype).requires_grad_() if bias else None
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_fp32_products_are_the_fp32_result_rounded_once(dtype, bias):
    x, w, b = _operands(dtype, bias)
    y = linear(x, w, b, fp32=True)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    y.backward(grad)
    leaves = [t for t in (x, w, b) if t is not None]
    ref = [t.detach().float().requires_grad_() for t in leaves]
    y_ref = F.linear(ref[0], ref[1], ref[2] if bias else None)
    y_ref.backward(grad.float())
    assert y.dtype == dtype
    # the products are exact in fp32, so only the order of the fp32 sums can differ: at most
    # one rounding step of the low-precision result
    for got, want in [(y, y_ref)] + [(t.grad, r.grad) for t, r in zip(leaves, ref)]:
        assert got.dtype == dtype
        torch.testing.assert_close(got, want.to(dtype), rtol=torch.finfo(dtype).eps, atol=1e-6)


def test_the_backward_keeps_only_the_low_precision_operands():
    x, w, b = _operands(torch.bfloat16)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        linear(x, w, b, fp32=True).sum().backward()
    assert saved and all(t.dtype == torch.bfloat16 for t in saved)
    assert sum(t.numel() for t in saved) == x.numel() + w.numel()


def test_fp32_tensors_and_the_native_setting_take_torchs_kernel():
    x, w, b = _operands(torch.float32)
    assert torch.equal(linear(x, w, b, fp32=True), F.linear(x, w, b))
    x, w, b = _operands(torch.bfloat16)
    assert torch.equal(linear(x, w, b, fp32=False), F.linear(x, w, b))


def test_settings_resolve_and_auto_follows_the_cpus_amx_flag():
    assert fp32_products("fp32") and not fp32_products("native")
    assert fp32_products("auto") == ("amx_bf16" not in products.cpu_flags())
    with pytest.raises(ValueError, match="auto, fp32 or native, not 'fast'"):
        fp32_products("fast")
    assert describe("native").endswith("torch's low-precision kernels (cpu_matmul_precision: "
                                       "native)")
    assert "run as fp32 products rounded back (cpu_matmul_precision: fp32)" in describe("fp32")


def _model(setting: str) -> GPTModel:
    config = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4,
                         intermediate_size=256, seq_length=32, max_position_embeddings=32,
                         padded_vocab_size=128, cpu_matmul_precision=setting)
    torch.manual_seed(0)
    return GPTModel(config).to(torch.bfloat16)


def test_a_bf16_model_with_fp32_products_matches_the_fp32_model_at_least_as_well_as_native():
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(32).expand(2, 32)
    fast, native = _model("fp32"), _model("native")
    assert fast.state_dict().keys() == native.state_dict().keys()
    reference = _model("native").float()
    with torch.no_grad():
        want = reference(tokens, positions).float()
        got_fast, got_native = fast(tokens, positions).float(), native(tokens, positions).float()
    err_fast = (got_fast - want).abs().max().item()
    err_native = (got_native - want).abs().max().item()
    # the same function in bf16: both within bf16 rounding of the fp32 model
    assert err_fast < 0.05 and err_native < 0.05
    assert not torch.equal(got_fast, got_native)  # a different kernel did run
