"""Every fusion flag set to true says, once at startup, which path runs and why; on CPU tensors
rmsnorm_fusion runs torch's rms_norm op, equal to the written-out RMSNorm."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from megatron.model import fusions
from megatron.model.fusions import FUSION_FLAGS, fusion_paths
from megatron.model.norms import FusedRMSNorm, RMSNorm
from tests.distributed import run_distributed


def section(norm="layernorm", activation="gelu", pos_emb="rotary", on=True):
    return SimpleNamespace(norm=norm, activation=activation, pos_emb=pos_emb,
                           **{flag: on for flag in FUSION_FLAGS})


def test_each_flag_set_to_true_gets_one_line_naming_the_path():
    lines = fusion_paths(section())
    assert [line.split(":")[0] for line in lines] == list(FUSION_FLAGS)
    text = dict(line.split(": ", 1) for line in lines)
    assert text["bias_gelu_fusion"] == (
        "GELU's tanh approximation, as GPT-NeoX: the Triton bias+gelu kernel on GPU tensors; "
        "torch's gelu(approximate='tanh') on CPU tensors")
    assert text["scaled_upper_triang_masked_softmax_fusion"].startswith(
        "torch scaled_dot_product_attention runs scale, causal mask and softmax as one fused")
    assert text["layernorm_fusion"] == ("the Triton layernorm kernel (forward and backward) on "
                                        "GPU tensors; torch.nn.LayerNorm on CPU tensors")
    assert text["bias_dropout_fusion"] == ("the Triton dropout+residual-add kernel on GPU tensors; "
                                           "eager dropout and add on CPU tensors")
    assert text["rmsnorm_fusion"] == "norm is layernorm, not rmsnorm; nothing to fuse"


def test_flags_that_do_not_apply_say_so_and_flags_off_say_nothing():
    text = dict(line.split(": ", 1) for line in
                fusion_paths(section(norm="rmsnorm", activation="swiglu", pos_emb="alibi")))
    assert text["rmsnorm_fusion"] == ("the Triton rmsnorm kernel (forward and backward) on GPU "
                                      "tensors; torch's rms_norm op on CPU tensors")
    assert text["layernorm_fusion"] == "norm is rmsnorm, not layernorm; nothing to fuse"
    assert text["bias_gelu_fusion"] == "activation is swiglu, not gelu; nothing to fuse"
    assert text["rope_fusion"] == "pos_emb is alibi, not rotary; nothing to fuse"
    assert fusion_paths(section(on=False)) == []


def test_without_triton_the_line_says_so(monkeypatch):
    monkeypatch.setattr(fusions, "triton_kernels", lambda: None)
    text = dict(line.split(": ", 1) for line in fusion_paths(section(activation="swiglu")))
    assert text["use_flashattn_swiglu"] == ("`triton` is not installed, so eager silu(gate) * value "
                                            "runs (pip install triton)")
    assert not fusions.use_triton(torch.ones(1))


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_fused_rmsnorm_equals_reference(dtype, atol):
    ref, fused = RMSNorm(64, 1e-5, bias=True), FusedRMSNorm(64, 1e-5, bias=True)
    with torch.no_grad():
        ref.weight.normal_(), ref.bias.normal_()
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(2, 8, 64, dtype=dtype, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out_ref, out = ref.to(dtype)(x), fused.to(dtype)(x2)
    assert out.dtype == dtype
    assert torch.allclose(out.float(), out_ref.float(), atol=atol)
    out_ref.float().square().sum().backward()
    out.float().square().sum().backward()
    assert torch.allclose(x2.grad.float(), x.grad.float(), atol=atol * 10)
    assert torch.allclose(fused.weight.grad.float(), ref.weight.grad.float(), rtol=atol * 10)


def _engine_log(rank, world, tmp, checkpointing=True):
    """Build the training engine of a config with fusion flags and every checkpointing option
    on (checkpoint_activations itself as `checkpointing` says), train two steps; return the
    startup lines, the norm class and the losses."""
    from pathlib import Path

    from tests.checkpointing.engines import build, make_args, train

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("megatron")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    args = make_args(Path(tmp), norm="rmsnorm", rmsnorm_fusion=True, bias_gelu_fusion=True,
                     checkpoint_activations=checkpointing, partition_activations=True,
                     contiguous_checkpointing=True, checkpoint_in_cpu=True,
                     synchronize_each_layer=True)
    engine = build(args)
    losses = train(engine, args, 2)
    norms = {type(m).__name__ for m in engine.engine.module.modules() if type(m).__name__.endswith("RMSNorm")}
    return [r.getMessage() for r in records], norms, losses


def test_engine_says_which_paths_run_once_and_trains(tmp_path):
    [(lines, norms, losses)] = run_distributed(_engine_log, 1, str(tmp_path))
    assert norms == {"FusedRMSNorm"}
    assert all(loss == loss and loss < 10 for loss in losses)
    fusion = [line for line in lines if line.split(":")[0] in FUSION_FLAGS]
    assert fusion == [
        "bias_gelu_fusion: GELU's tanh approximation, as GPT-NeoX: the Triton bias+gelu kernel on "
        "GPU tensors; torch's gelu(approximate='tanh') on CPU tensors",
        "rmsnorm_fusion: the Triton rmsnorm kernel (forward and backward) on GPU tensors; torch's "
        "rms_norm op on CPU tensors",
    ]
    assert ("activation checkpointing: 1 layer(s) per checkpoint, 2 checkpoints per forward "
            "pass, recomputed through deepspeed.checkpointing") in lines
    assert any(line.startswith("partition_activations: model_parallel_size is 1") for line in lines)
    assert any(line.startswith("checkpoint_in_cpu: the run is on CPU") for line in lines)
    assert any(line.startswith("synchronize_each_layer: CPU operations") for line in lines)


def test_checkpointing_options_without_checkpoint_activations_each_say_they_change_nothing(
        tmp_path):
    """As GPT-NeoX, they are accepted (its pythia/14M.yml sets synchronize_each_layer with
    checkpointing off); one start-up line each says so, and the run trains."""
    [(lines, _, losses)] = run_distributed(_engine_log, 1, str(tmp_path), False)
    assert all(loss == loss and loss < 10 for loss in losses)
    idle = [line for line in lines if "checkpoint_activations is false" in line]
    assert idle == [f"{key} is true but checkpoint_activations is false: nothing is "
                    "checkpointed, so it changes nothing in this run (set "
                    "checkpoint_activations: true for it to act)"
                    for key in ("partition_activations", "contiguous_checkpointing",
                                "checkpoint_in_cpu", "synchronize_each_layer")]
    assert not any(line.startswith("activation checkpointing:") for line in lines)


def test_the_cross_entropy_line_of_a_gpu_run_names_its_path(monkeypatch):
    if fusions.triton_kernels() is not None:
        assert fusions.cross_entropy_path().startswith(
            "cross entropy: the Triton kernels on GPU tensors (each token's logits read once")
    monkeypatch.setattr(fusions, "triton_kernels", lambda: None)
    assert fusions.cross_entropy_path() == (
        "cross entropy: torch ops over blocks of logits, since `triton` is not installed (pip "
        "install triton for the two-kernel path)")
