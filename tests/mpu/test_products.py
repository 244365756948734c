"""bf16/fp16 products on CPU tensors run in fp32 (cpu_matmul_precision): equal to the fp32
product rounded once, gradients included, keeping only low-precision tensors for the backward."""

import re

import pytest
import torch
import torch.nn.functional as F

from megatron.checkpointing.manifest import Manifest, write_manifest
from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel
from megatron.mpu import products
from megatron.mpu.products import describe, fp32_products, linear
from megatron.training.engine import recorded_products


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


def test_settings_resolve_and_an_unmeasured_auto_follows_the_cpus_amx_flag():
    # what deepy.py's memory estimate assumes before the workers time the two products
    assert fp32_products("fp32") and not fp32_products("native")
    assert fp32_products("auto") == ("amx_bf16" not in products.cpu_flags())
    with pytest.raises(ValueError, match="auto, fp32 or native, not 'fast'"):
        fp32_products("fast")
    assert describe("native") == ("bf16/fp16 products on CPU tensors run torch's low-precision "
                                  "kernels (cpu_matmul_precision: native); set "
                                  "cpu_matmul_precision: fp32 for fp32 products")
    assert "run as fp32 products rounded back (cpu_matmul_precision: fp32)" in describe("fp32")
    assert describe("fp32", "why not").startswith(
        "bf16/fp16 products on CPU tensors run as fp32 products rounded back "
        "(cpu_matmul_precision: auto, why not); set cpu_matmul_precision: native")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_auto_takes_the_faster_of_the_two_products_it_timed(dtype):
    choice, why = products.measured_choice(dtype, repeats=2)
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    if products.cpu_flags() & {"amx_bf16", "amx_fp16"}:
        pytest.skip("a CPU with AMX tiles takes its native kernels without timing them")
    found = re.fullmatch(rf"measured on this CPU: (\d+) GFLOP/s in {name} against (\d+) as fp32 "
                         "products", why)
    assert found, why
    native, fp32 = map(int, found.groups())
    assert native > 0 and fp32 > 0
    if native != fp32:  # the figures are rounded; the choice compared the times
        assert choice == ("native" if native > fp32 else "fp32")


def test_auto_takes_native_kernels_without_timing_them_where_the_cpu_has_amx(monkeypatch):
    monkeypatch.setattr(products, "cpu_flags", lambda: frozenset({"avx512f", "amx_bf16"}))
    monkeypatch.setattr(products.F, "linear", None)  # a timing would fail
    assert products.measured_choice(torch.bfloat16) == ("native",
                                                        "the CPU has AMX tiles (amx_bf16)")
    with pytest.raises(TypeError):  # fp16 needs amx_fp16: it is timed
        products.measured_choice(torch.float16)


def test_auto_takes_fp32_products_where_torchs_low_precision_product_fails(monkeypatch):
    real = F.linear

    def no_fp16(x, w, b=None):
        if x.dtype == torch.float16:
            raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')
        return real(x, w, b)

    monkeypatch.setattr(products.F, "linear", no_fp16)
    monkeypatch.setattr(products, "cpu_flags", lambda: frozenset())
    assert products.measured_choice(torch.float16) == (
        "fp32", "torch's fp16 product fails on this CPU (\"addmm_impl_cpu_\" not implemented for "
        "'Half')")


def test_resolve_decides_only_auto_for_low_precision_cpu_tensors():
    assert products.resolve("native", "bf16", "cpu") == ("native", "")
    assert products.resolve("fp32", "fp16", "cpu") == ("fp32", "")
    assert products.resolve("auto", "fp32", "cpu") == ("auto", "")
    assert products.resolve("auto", "bf16", "cuda") == ("auto", "")
    setting, why = products.resolve("auto", "bf16", "cpu")
    assert setting in ("fp32", "native") and why


@pytest.mark.parametrize("recorded", ["fp32", "native"])
def test_a_run_resuming_a_checkpoint_keeps_the_products_it_records(tmp_path, recorded):
    root = tmp_path / "ckpt"
    (root / "global_step3").mkdir(parents=True)
    (root / "latest").write_text("global_step3")

    def save(run: dict) -> None:
        write_manifest(root / "global_step3", Manifest(
            iteration=3, tag="global_step3", run=run, contents={}, client_state={}, config={},
            files={}))

    def kept(iteration=None):
        return lambda: recorded_products(str(root), iteration)

    run = {"tp": 1, "precision": "bf16", "cpu_matmul_precision": recorded}
    save(run)
    assert products.resolve("auto", "bf16", "cpu", kept()) == (
        recorded, f"as {root / 'global_step3'} was trained, so that the run continues it")
    assert products.resolve("auto", "bf16", "cpu", kept(3))[0] == recorded
    other = "native" if recorded == "fp32" else "fp32"  # a setting of its own wins
    assert products.resolve(other, "bf16", "cpu", kept()) == (other, "")
    # a checkpoint written before the choice was recorded: timed as for a new run
    run.pop("cpu_matmul_precision")
    save(run)
    assert products.resolve("auto", "bf16", "cpu", kept())[1].startswith(
        ("measured on this CPU", "the CPU has AMX tiles"))


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
