"""The GPU tier (`make test-gpu`): training steps, precision, attention kernels, exact resume and a
real launch on a CUDA device. Every test here needs one and is skipped without it.

The engine scenarios run in a spawned worker process (tests/distributed.py) that joins an NCCL
process group of one rank (gloo beside it for CPU tensors), as a launched worker would.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.distributed import run_distributed
from tests.runs import ROOT, deepy, explain, free_port

pytestmark = pytest.mark.gpu

# ---- run inside the worker process -------------------------------------------------------


def _build(directory: Path, **overrides):
    import deepspeed
    import torch.distributed as dist

    from megatron.mpu.initialize import disable_deepspeed_shm_allreduce, resolve_backend
    from tests.checkpointing import engines

    disable_deepspeed_shm_allreduce()
    if not dist.is_initialized():  # nccl with gloo beside it; gloo alone without CUDA
        deepspeed.init_distributed(dist_backend=resolve_backend("auto"), auto_mpi_discovery=False,
                                   verbose=False)
    args = engines.make_args(directory, **overrides)
    return args, engines.build(args, backend=resolve_backend("auto"))


def _loss_scale(engine) -> float:
    return float(engine.engine._get_optimizer_loss_scale())


def _fp16_scaler(rank, world, directory: Path, pipe: int) -> dict:
    """fp16 with dynamic loss scaling from 2^32: the first steps overflow and are skipped, the
    scale falls; a checkpoint keeps the scale and a resumed run continues bit-exactly."""
    from megatron.checkpointing import load_checkpoint, save_checkpoint
    from tests.checkpointing import engines

    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 32, "hysteresis": 1,
            "loss_scale_window": 1000, "min_loss_scale": 1}
    args, engine = _build(directory, fp16=fp16, bf16=None, pipe_parallel_size=pipe)
    out = {"dtype": str(next(engine.engine.module.parameters()).dtype),
           "device": str(next(engine.engine.module.parameters()).device),
           "initial_scale": _loss_scale(engine)}
    before = engines.weights(engine)
    out["first_loss"] = engines.train(engine, args, 1)[0]
    out["scale_after_first"] = _loss_scale(engine)
    out["skipped_after_first"] = engine.engine.skipped_steps
    out["unchanged_after_overflow"] = all(torch.equal(before[k], v)
                                          for k, v in engines.weights(engine).items())
    losses = engines.train(engine, args, 30, seed=1)
    out["losses"] = losses
    out["skipped"] = engine.engine.skipped_steps
    out["scale"] = _loss_scale(engine)
    save_checkpoint(engine, args.checkpoint, 31, {})
    after_save = engines.train(engine, args, 3, seed=2)
    args2, second = _build(directory, fp16=fp16, bf16=None, pipe_parallel_size=pipe)
    load_checkpoint(second, args2.checkpoint)
    out["resumed_scale"] = _loss_scale(second)
    out["same_continuation"] = engines.train(second, args2, 3, seed=2) == after_save
    return out


def _bf16_against_fp32(rank, world, directory: Path) -> dict:
    """The same three steps (same initial weights, same batches) in fp32 and bf16 on CUDA."""
    from tests.checkpointing import engines

    out = {}
    for name, precision in (("fp32", None), ("bf16", {"enabled": True})):
        args, engine = _build(directory / name, bf16=precision, fp16=None, hidden_dropout=0.0,
                              attention_dropout=0.0)
        out[name] = engines.train(engine, args, 3)
        out[name + "_dtype"] = str(next(engine.engine.module.parameters()).dtype)
    return out


def _exact_resume(rank, world, directory: Path, pipe: int, compiled: bool = False) -> dict:
    """Dropout on: train 3 steps, save, train 2; a fresh engine loads and trains the same 2 —
    the CUDA generator's state travels in the checkpoint (with `compiled`, torch_compile: the
    masks of inductor's kernels are drawn from it too)."""
    from megatron.checkpointing import load_checkpoint, save_checkpoint
    from tests.checkpointing import engines

    overrides = dict(bf16={"enabled": True}, fp16=None, hidden_dropout=0.1,
                     attention_dropout=0.1, pipe_parallel_size=pipe, torch_compile=compiled)
    args, first = _build(directory, **overrides)
    engines.train(first, args, 3)
    save_checkpoint(first, args.checkpoint, 3, {})
    after = engines.train(first, args, 2, seed=1)
    weights = engines.weights(first)
    args2, second = _build(directory, **overrides)
    load_checkpoint(second, args2.checkpoint)
    resumed = engines.train(second, args2, 2, seed=1)
    return {"after": after, "resumed": resumed,
            "same_weights": all(torch.equal(weights[k], v)
                                for k, v in engines.weights(second).items()),
            "device": str(next(second.engine.module.parameters()).device)}


def _compiled_against_eager(rank, world, directory: Path) -> dict:
    """The same three bf16 steps with the fusion flags' Triton kernels (eager layers) and with
    torch_compile (inductor's kernels in their place)."""
    from megatron.model.compile import graphs_compiled
    from tests.checkpointing import engines

    flags = dict(layernorm_fusion=True, rope_fusion=True, bias_gelu_fusion=True,
                 bias_dropout_fusion=True, pos_emb="rotary")
    out = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        before = graphs_compiled()
        args, engine = _build(directory / name, bf16={"enabled": True}, fp16=None,
                              hidden_dropout=0.0, attention_dropout=0.0, torch_compile=compiled,
                              **flags)
        out[name] = engines.train(engine, args, 3)
        out[name + "_graphs"] = graphs_compiled() - before
    return out


# ---- the tests -------------------------------------------------------------------------------


def _optimizer_loops(rank, world, directory: Path, fused: bool, layout: str) -> dict:
    """Three clipped steps with DeepSpeed's bf16 (ZeRO 0), ZeRO 1 or fp16 optimizer (bf16-zero0,
    bf16-zero1, fp16-zero0: FP16_UnfusedOptimizer with a torch optimizer), its per-parameter
    loops fused (megatron/training/optimizer_loops.py) or DeepSpeed's own."""
    import functools

    import megatron.training.engine as engine_module
    from tests.checkpointing import engines

    if not fused:
        engine_module.fuse_optimizer_loops = lambda optimizer: False
    dtype, zero = layout.split("-zero")
    precision = ({"bf16": {"enabled": True}, "fp16": None} if dtype == "bf16" else
                 {"bf16": None, "fp16": {"enabled": True, "loss_scale": 0,
                                         "initial_scale_power": 12}})
    args, engine = _build(directory, **precision, gradient_clipping=0.01, hidden_dropout=0.0,
                          attention_dropout=0.0, zero_optimization={"stage": int(zero)})
    losses = engines.train(engine, args, 3)
    optimizer = engine.engine.optimizer
    hook = {"bf16-zero0": "update_hp_grads", "bf16-zero1": "has_overflow_partitioned_grads_serial",
            "fp16-zero0": "unscale_and_clip_grads"}[layout]
    return {"losses": losses, "norm": float(optimizer._global_grad_norm),
            "fused": isinstance(getattr(optimizer, hook), functools.partial),
            "optimizer": type(optimizer).__name__}


def check_fp16_scaler(out: dict, device: str) -> None:
    """What `_fp16_scaler` must find (also run on CPU: tests/training/test_fp16_loss_scale.py)."""
    assert out["device"] == device and out["dtype"] == "torch.float16", out
    assert out["initial_scale"] == 2.0 ** 32, out
    # 2^32 times a loss of ~5.5 overflows fp16: the step is skipped and the scale halves
    assert out["skipped_after_first"] == 1 and out["scale_after_first"] == 2.0 ** 31, out
    assert out["unchanged_after_overflow"], out
    assert 1 < out["skipped"] < 31 and out["scale"] < 2.0 ** 31, out
    assert all(math.isfinite(x) for x in out["losses"]), out
    assert out["resumed_scale"] == out["scale"], out
    assert out["same_continuation"], out


@pytest.mark.parametrize("pipe", [0, 1], ids=["plain", "pipeline"])
def test_fp16_overflow_skips_the_step_lowers_the_scale_and_resume_keeps_the_scale(tmp_path, pipe):
    check_fp16_scaler(run_distributed(_fp16_scaler, 1, tmp_path, pipe, join=False)[0], "cuda:0")


def test_bf16_steps_on_cuda_follow_the_fp32_ones(tmp_path):
    out = run_distributed(_bf16_against_fp32, 1, tmp_path, join=False)[0]
    assert out["fp32_dtype"] == "torch.float32" and out["bf16_dtype"] == "torch.bfloat16"
    assert abs(out["fp32"][0] - math.log(256)) < 0.5  # random tokens of a 256-token vocabulary
    for a, b in zip(out["fp32"], out["bf16"]):
        assert abs(a - b) < 2e-2 * a, (out["fp32"], out["bf16"])


def test_compiled_layers_follow_the_fused_eager_ones_on_cuda(tmp_path):
    out = run_distributed(_compiled_against_eager, 1, tmp_path, join=False)[0]
    assert out["eager_graphs"] == 0 and out["compiled_graphs"] == 1, out
    for a, b in zip(out["eager"], out["compiled"]):
        assert abs(a - b) < 1e-2 * a, out


@pytest.mark.parametrize("pipe,compiled", [(0, False), (1, False), (1, True)],
                         ids=["plain", "pipeline", "pipeline-compiled"])
def test_a_resumed_run_with_dropout_continues_bit_exactly_on_cuda(tmp_path, pipe, compiled):
    out = run_distributed(_exact_resume, 1, tmp_path, pipe, compiled, join=False)[0]
    assert out["device"] == "cuda:0"
    assert out["resumed"] == out["after"]
    assert out["same_weights"]


@pytest.mark.parametrize("layout", ["bf16-zero0", "bf16-zero1", "fp16-zero0"])
def test_the_fused_optimizer_loops_follow_deepspeeds_on_cuda(tmp_path, layout):
    ours = run_distributed(_optimizer_loops, 1, tmp_path / "fused", True, layout, join=False)[0]
    theirs = run_distributed(_optimizer_loops, 1, tmp_path / "ds", False, layout, join=False)[0]
    assert ours["fused"] and not theirs["fused"]
    assert ours["optimizer"] == theirs["optimizer"] == {
        "bf16-zero0": "BF16_Optimizer", "bf16-zero1": "DeepSpeedZeroOptimizer",
        "fp16-zero0": "FP16_UnfusedOptimizer"}[layout]
    # the multi-tensor norm kernel may sum in another order than one kernel per tensor
    assert ours["norm"] == pytest.approx(theirs["norm"], rel=1e-5)
    assert ours["norm"] > 0.01  # every step clipped
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-3)


def _qkv(b, h, s, d, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g) for _ in range(3)]


def test_causal_attention_runs_on_sdpas_flash_kernel_and_matches_the_reference():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from megatron.model.attention_impls import reference_attention, sdpa_attention

    q, k, v = _qkv(2, 8, 1024, 64)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # raises if flash cannot take these inputs
        out = sdpa_attention(q, k, v, None, 0.0, True)
    ref = reference_attention(q.float(), k.float(), v.float(), None, 0.0, True)
    assert (out.float() - ref).abs().max().item() < 2e-2


def test_a_sliding_window_on_cuda_matches_the_reference():
    from megatron.model.attention_impls import reference_attention, sdpa_attention

    q, k, v = _qkv(1, 4, 512, 64)
    s, window = 512, 64
    i = torch.arange(s, device="cuda")
    keep = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - window)
    out = sdpa_attention(q, k, v, keep[None, None], 0.0, True)
    ref = reference_attention(q.float(), k.float(), v.float(), keep[None, None], 0.0, True)
    assert (out.float() - ref).abs().max().item() < 2e-2


def test_two_steps_of_the_125m_config_through_deepy(small_data, tmp_path):
    prefix, tokenizer = small_data
    run = tmp_path / "run"
    proc = deepy("train.py", str(ROOT / "configs" / "125M.yml"),
                 f"data_path={prefix}", f"vocab_file={tokenizer}", "tokenizer_type=HFTokenizer",
                 f"save={run / 'ckpt'}", f"load={run / 'ckpt'}", f"log_dir={run / 'logs'}",
                 "train_iters=2", "lr_decay_iters=2", "log_interval=1", "eval_interval=2",
                 "eval_iters=1", "checkpoint_factor=2", "split=900,50,50", f"master_port={free_port()}",
                 "num_gpus=1", "use_wandb=false", timeout=600)
    assert proc.returncode == 0, explain(proc)
    records = (run / "logs" / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, records) if "learning_rate" in r]
    assert [r["iteration"] for r in train] == [1, 2]
    # fp16 from a scale of 2^16: a step whose scaled gradients overflow is skipped, and its
    # interval then has no loss (GPT-NeoX's rule)
    assert all(r["loss_scale"] >= 2 ** 14 for r in train), train
    assert all(math.isfinite(r["lm_loss"]) for r in train if "lm_loss" in r), train
    assert (run / "ckpt" / "global_step2" / "manifest.json").is_file()


def test_moe_experts_run_as_one_grouped_product_on_cuda_in_bf16():
    """The bf16 grouped expert product (torch._grouped_mm) against the loop over experts in
    fp32: output and gradients within bf16's rounding."""
    from megatron.model.moe import grouped_gemm
    from tests.model.test_moe import moe_layer

    moe = moe_layer(activation="swiglu", moe_router_type="topk").cuda()
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(64, 32, generator=g).cuda()
    counts = [20, 0, 30, 14]
    grad = torch.randn(64, 32, generator=g).cuda()
    weights = (moe.experts.w_in, moe.experts.w_out)
    loop = torch.cat([moe.experts.activation(r @ moe.experts.w_in[e].t()) @
                      moe.experts.w_out[e].t() for e, r in enumerate(rows.split(counts))])
    want = torch.autograd.grad(loop, weights, grad)
    moe.bfloat16()
    assert grouped_gemm("cuda", torch.bfloat16, 32, 96, 48)
    out = moe.experts(rows.bfloat16(), counts)
    got = torch.autograd.grad(out, (moe.experts.w_in, moe.experts.w_out), grad.bfloat16())
    torch.testing.assert_close(out.float(), loop, rtol=2e-2, atol=2e-2)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b, rtol=2e-2, atol=2e-2)


def test_the_cross_entropy_of_a_gpt2_sized_step_equals_torchs_in_few_kernel_launches():
    """16,384 tokens x 50,304 bf16 logits (125M at micro batch 8, seq 2048): the cross entropy's
    Triton kernels give torch's loss and gradient on fp32 logits, and forward plus backward
    launch fewer than 50 kernels (the two Triton kernels and a few per-token ops; the blocked
    torch code, which CPU tensors take, launches several hundred over 2^24-value blocks)."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from megatron.model.fusions import cross_entropy
    from megatron.mpu.groups import NO_TP

    g = torch.Generator(device="cuda").manual_seed(0)
    tokens, vocab = 16_384, 50_304
    logits = (torch.randn(tokens, vocab, device="cuda", generator=g) * 4).bfloat16()
    labels = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
    logits.requires_grad_()
    cross_entropy(logits, labels, NO_TP).sum().backward()  # warm-up
    logits.grad = None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        loss = cross_entropy(logits, labels, NO_TP)
        loss.sum().backward()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert 0 < len(kernels) < 50, len(kernels)
    assert any("_ce_lse" in e.name for e in kernels) and any("_ce_grad" in e.name for e in kernels)
    got_grad, logits.grad = logits.grad, None
    want = F.cross_entropy(logits.float(), labels, reduction="none")
    want.sum().backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got_grad.float(), logits.grad.float(), rtol=1.6e-2, atol=1e-5)
