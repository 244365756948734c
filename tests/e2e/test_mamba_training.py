"""Mamba training through `deepy.py train.py configs/tiny.yml configs/tiny_mamba.yml` (its
workers forked in-process, tests/runs.py; Mamba layers 0, 1 and 3, attention layer 2): tensor parallel 2, pipeline 2, ZeRO 2 over two replicas
and tensor x pipeline 2 x 2 with activation checkpointing train the same model as one process
under the dense runs' tolerance (tests/e2e/test_equivalence.py); the channels and their
optimizer state reshard to one rank; a stopped run resumes bit for bit; an attention config
cannot load the Mamba checkpoint; GPT-NeoX's configs/mamba/mamba-130M.yml trains on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from megatron.checkpointing.weights import full_weights
from tests.checkpointing.test_resume_e2e import (assert_stop_and_resume_exact,
                                                 losses_by_iteration, run)
from tests.checkpointing.test_reshard import assert_same_state, full_state
from tests.e2e.test_equivalence import STEPS, assert_trains_like, overrides
from tests.runs import (NEOX_CONFIGS, deepy, explain, launch_in_process, read_metrics,
                        tiny_overrides)

MAMBA = ("configs/tiny.yml", "configs/tiny_mamba.yml")
LAYOUTS = {
    "tp2": dict(num_gpus=2, model_parallel_size=2),
    "pp2": dict(num_gpus=2, pipe_parallel_size=2,
                pipe_partition_method="type:transformer|mamba"),
    "zero2-dp2": dict(num_gpus=2, pipe_parallel_size=0, zero_optimization="{stage: 2}"),
}


def train(small_data, run_dir, **layout):
    """(losses of every step, the final checkpoint directory)."""
    prefix, tok = small_data
    proc = launch_in_process("train.py", *MAMBA,
                             *tiny_overrides(prefix, tok, run_dir, **overrides(**layout)))
    assert proc.returncode == 0, explain(proc)
    records, _ = read_metrics(run_dir / "logs")
    return [r["lm_loss"] for r in records], run_dir / "ckpt" / f"global_step{STEPS}"


@pytest.fixture(scope="module")
def single(small_data, tmp_path_factory):
    return train(small_data, tmp_path_factory.mktemp("mamba-single"))


@pytest.fixture(scope="module")
def tp2_pp2(small_data, tmp_path_factory):
    """Tensor x pipeline 2 x 2, stages balanced by parameters, layers recomputed."""
    return train(small_data, tmp_path_factory.mktemp("mamba-tp2pp2"), num_gpus=4,
                 model_parallel_size=2, pipe_parallel_size=2, pipe_partition_method="parameters",
                 checkpoint_activations="true")


def test_tensor_and_pipeline_parallel_with_recompute_train_like_one_process(single, tp2_pp2):
    losses, step_dir = single
    got_losses, got_dir = tp2_pp2
    weights = full_weights(got_dir)
    assert weights["1.mixer.in_proj.weight"].shape == (512, 128)  # both halves, both ranks
    assert_trains_like(got_losses, weights, losses, full_weights(step_dir))


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_mamba_layouts_train_like_one_process(small_data, tmp_path, single, layout):
    losses, step_dir = single
    got_losses, got_dir = train(small_data, tmp_path, **LAYOUTS[layout])
    assert_trains_like(got_losses, full_weights(got_dir), losses, full_weights(step_dir))


def test_the_reshard_tool_merges_mamba_channels_and_their_optimizer_state(
        small_data, tmp_path, tp2_pp2):
    *_, step_dir = tp2_pp2
    prefix, tok = small_data
    out = tmp_path / "one"
    proc = launch_in_process("tools/ckpts/reshard.py", *MAMBA,
                             *tiny_overrides(prefix, tok, tmp_path, num_gpus=1,
                                             model_parallel_size=1, pipe_parallel_size=0,
                                             train_iters=STEPS, load=step_dir.parent, save=out))
    assert proc.returncode == 0, explain(proc)
    merged = full_state(out)
    assert merged.state["1.mixer.A_log"]["exp_avg"].shape == (256, 16)
    assert_same_state(full_state(step_dir.parent), merged)


@pytest.mark.slow
def test_stop_and_resume_in_bf16_is_bitwise_identical_with_a_and_d_in_fp32(small_data, tmp_path):
    """bf16 with mamba_selective_fp32_params (GPT-NeoX's default): A_log and D stay fp32 in the
    module, in the checkpoint and through a resume; the other weights are bf16."""
    mamba = {"attention_config": "[[[mamba, mamba, global, mamba], 1]]", "norm": "rmsnorm",
             "pos_emb": "none", "mamba_selective_scan_fusion": "true", "bf16": "{enabled: true}"}
    reference = tmp_path / "uninterrupted"
    proc = run(small_data, reference, **mamba)
    assert proc.returncode == 0, explain(proc)
    assert ("mamba_selective_fp32_params: 6 Mamba parameters (A_log, D) stay fp32 in this bf16 "
            "run, in optimizer groups of their own") in proc.stderr
    weights = full_weights(reference / "ckpt" / "global_step6")
    for name in ("1.mixer.A_log", "1.mixer.D", "4.mixer.A_log"):
        assert weights[name].dtype == torch.float32, name
        trained = weights[name]  # updated in fp32: values bf16 cannot hold
        assert not torch.equal(trained, trained.bfloat16().float()), name
    assert weights["1.mixer.in_proj.weight"].dtype == torch.bfloat16
    assert_stop_and_resume_exact(small_data, tmp_path / "resumed",
                                 (losses_by_iteration(reference), reference / "ckpt"), **mamba)
    # into tensor-parallel ZeRO 1 (DeepSpeed's ZeRO optimizer instead of its bf16 one): the
    # fp32 groups and their optimizer state carry over bit for bit
    prefix, tok = small_data
    out = tmp_path / "tp2-zero1"
    proc = launch_in_process("tools/ckpts/reshard.py", "configs/tiny.yml",
                             *tiny_overrides(prefix, tok, tmp_path, **mamba, num_gpus=2,
                                             model_parallel_size=2, pipe_parallel_size=0,
                                             zero_optimization="{stage: 1}", train_iters=STEPS,
                                             load=reference / "ckpt", save=out))
    assert proc.returncode == 0, explain(proc)
    resharded = full_state(out)
    assert resharded.weights["1.mixer.A_log"].dtype == torch.float32
    assert_same_state(full_state(reference / "ckpt"), resharded)


def test_an_attention_config_cannot_load_the_mamba_checkpoint(small_data, tmp_path, single):
    _, step_dir = single
    prefix, tok = small_data
    proc = deepy("train.py", "configs/tiny.yml",
                 *tiny_overrides(prefix, tok, tmp_path, load=step_dir.parent,
                                 train_iters=STEPS + 2))
    assert proc.returncode != 0
    assert (f"checkpoint {step_dir} holds another model than this config (mamba layers "
            "(attention_config): checkpoint [0, 1, 3], this run []; mamba channels "
            "(intermediate_size): checkpoint 256, this run 0): load it with the model config it "
            "was trained with") in proc.stderr
    assert "launching" not in proc.stderr + proc.stdout  # refused before any worker started


@pytest.mark.slow
def test_gpt_neox_mamba_130m_config_trains_in_a_shortened_run(small_data, tmp_path):
    """GPT-NeoX's configs/mamba/mamba-130M.yml at its full depth (24 Mamba layers, 768 hidden,
    its three fusion flags: the chunked scan on CPU), on one CPU process at 128 tokens for two
    steps, in fp32 (its fp16 needs a GPU)."""
    prefix, tok = small_data
    proc = launch_in_process("train.py", str(NEOX_CONFIGS / "mamba" / "mamba-130M.yml"),
                             *tiny_overrides(
        prefix, tok, tmp_path, hostfile="null", num_gpus=1, seq_length=128,
        train_micro_batch_size_per_gpu=1, train_batch_size=1, train_iters=2, lr_decay_iters=2,
        split="900,50,50", log_interval=1, eval_interval=2, eval_iters=1, checkpoint_factor=2,
        tokenizer_type="HFTokenizer", fp16="{enabled: false}", distributed_backend="gloo"))
    assert proc.returncode == 0, explain(proc)
    assert "mamba: 24 of 24 layers, 1536 channels, state 16; scan: chunked torch scan" \
        in proc.stderr
    records, validation = read_metrics(tmp_path / "logs")
    assert [r["iteration"] for r in records] == [1, 2] and validation
    assert all(math.isfinite(r["lm_loss"]) for r in records)
