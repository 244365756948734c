"""Mixture-of-experts training through `deepy.py train.py configs/tiny.yml configs/tiny_moe.yml`
(its workers forked in-process, tests/runs.py; experts in layers 0 and 2, Sinkhorn routing, load-balancing and z losses in the loss): the
tensor x pipeline 2 x 2 layout (experts split over tensor ranks, MoE layers on both stages), a
data-parallel layout without gradient accumulation and expert-parallel layouts (experts split
over data-parallel ranks, alone and with tensor, pipeline, ZeRO 1/2 and expert-data-parallel
replicas) train the same model as one process with it, under the dense runs' tolerance
(tests/e2e/test_equivalence.py); the expert weights and their optimizer state reshard to one
rank, and into expert ranks; the log carries each layer's router losses and expert loads; a
stopped run resumes bit for bit (router jitter and dropout drawing from the restored
generators), with expert parallelism too; a dense config cannot load the MoE checkpoint.

Sinkhorn routing balances over the tokens of a micro-batch, so a layout is compared with one
process running the same micro-batches (8 sequences; 4 for the four-replica layout)."""

from __future__ import annotations

import math

import pytest

from megatron.checkpointing.weights import full_weights
from tests.checkpointing.test_resume_e2e import (assert_stop_and_resume_exact,
                                                 losses_by_iteration, run)
from tests.checkpointing.test_reshard import assert_same_state, full_state
from tests.e2e.test_equivalence import STEPS, assert_trains_like, overrides
from tests.runs import deepy, explain, launch_in_process, read_metrics, tiny_overrides

MOE = ("configs/tiny.yml", "configs/tiny_moe.yml")
MOE_LAYERS = (0, 2)


def launch(small_data, run_dir, *configs, **layout):
    prefix, tok = small_data
    return launch_in_process("train.py", *configs,
                             *tiny_overrides(prefix, tok, run_dir, **overrides(**layout)))


def train(small_data, run_dir, **layout):
    """(losses of every step, every metrics record, the final checkpoint directory)."""
    proc = launch(small_data, run_dir, *MOE, **layout)
    assert proc.returncode == 0, explain(proc)
    records, _ = read_metrics(run_dir / "logs")
    return [r["lm_loss"] for r in records], records, run_dir / "ckpt" / f"global_step{STEPS}"


@pytest.fixture(scope="module")
def single(small_data, tmp_path_factory):
    """One process accumulating the step's two micro-batches."""
    return train(small_data, tmp_path_factory.mktemp("moe-single"))


@pytest.fixture(scope="module")
def tp2_pp2(small_data, tmp_path_factory):
    return train(small_data, tmp_path_factory.mktemp("moe-tp2pp2"), num_gpus=4,
                 model_parallel_size=2, pipe_parallel_size=2)


@pytest.mark.slow
def test_tp2_pp2_trains_like_one_process(single, tp2_pp2):
    losses, _, step_dir = single
    got_losses, _, got_dir = tp2_pp2
    weights = full_weights(got_dir)
    assert any(".mlp.experts.w_in" in name for name in weights)
    assert_trains_like(got_losses, weights, losses, full_weights(step_dir))


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 3])
def test_data_parallel_without_accumulation_trains_like_one_process(small_data, tmp_path,
                                                                     single, zero):
    """Two replicas of one micro-batch each: the router losses' gradients are scaled as the
    language-model loss's (here 1, in the single process 1/2 per micro-batch); with ZeRO 3
    (a plain module: DeepSpeed's pipeline engine takes ZeRO 0 and 1 only) the experts' and
    router's weights are partitioned and gathered by DeepSpeed's module hooks."""
    losses, _, step_dir = single
    layout = dict(num_gpus=2) if zero == 0 else dict(
        num_gpus=2, pipe_parallel_size=0, zero_optimization=f"{{stage: {zero}}}")
    got_losses, _, got_dir = train(small_data, tmp_path, **layout)
    assert_trains_like(got_losses, full_weights(got_dir), losses, full_weights(step_dir))


# experts split over data-parallel ranks: dp 2 = ep 2 unless said otherwise
EXPERT_PARALLEL = {
    "ep2": dict(num_gpus=2, moe_expert_parallel_size=2),  # pipeline engine, torch optimizer
    "ep2-zero2": dict(num_gpus=2, moe_expert_parallel_size=2, pipe_parallel_size=0,
                      zero_optimization="{stage: 2}"),
    "ep2-tp2": dict(num_gpus=4, moe_expert_parallel_size=2, model_parallel_size=2),
    "ep2-pp2": dict(num_gpus=4, moe_expert_parallel_size=2, pipe_parallel_size=2),
    # two replicas of each expert rank: expert gradients summed over them
    "ep2-dp4-zero1": dict(num_gpus=4, moe_expert_parallel_size=2, pipe_parallel_size=0,
                          train_micro_batch_size_per_gpu=4, zero_optimization="{stage: 1}"),
}


@pytest.fixture(scope="module")
def single_micro4(small_data, tmp_path_factory):
    """One process accumulating four micro-batches of 4 sequences."""
    return train(small_data, tmp_path_factory.mktemp("moe-single-micro4"),
                 train_micro_batch_size_per_gpu=4)


@pytest.fixture(scope="module")
def ep2_tp2(small_data, tmp_path_factory):
    return train(small_data, tmp_path_factory.mktemp("moe-ep2-tp2"), **EXPERT_PARALLEL["ep2-tp2"])


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(EXPERT_PARALLEL))
def test_expert_parallel_layouts_train_like_one_process(small_data, tmp_path, request, layout):
    """Each rank runs its share of the experts on the tokens of its expert-parallel peers
    (all-to-all both ways); expert gradients are averaged over the ranks holding the same
    experts, the gradient norm counts every expert once (clipping is active: norms 1.1-3.3)."""
    micro4 = "train_micro_batch_size_per_gpu" in EXPERT_PARALLEL[layout]
    losses, _, step_dir = request.getfixturevalue("single_micro4" if micro4 else "single")
    if layout == "ep2-tp2":
        got_losses, records, got_dir = request.getfixturevalue("ep2_tp2")
    else:
        got_losses, records, got_dir = train(small_data, tmp_path, **EXPERT_PARALLEL[layout])
    weights = full_weights(got_dir)
    assert weights["1.mlp.experts.w_in"].shape[0] == 4  # every expert in the saved weights
    assert_trains_like(got_losses, weights, losses, full_weights(step_dir))
    assert records[0]["grad_norm"] > 1.0  # (gradient_clipping is 1.0)


def test_the_log_carries_each_moe_layers_losses_and_expert_loads(single):
    _, records, _ = single
    assert len(records) == STEPS
    for record in records:
        for layer in MOE_LAYERS:
            loads = [record[f"moe/layer_{layer}/expert_{e}_load"] for e in range(4)]
            assert math.isclose(sum(loads), 1.0, rel_tol=1e-5), loads
            # Switch's balance loss is top_k (2) for even routing, at most experts * top_k
            assert 1.5 < record[f"moe/layer_{layer}/balance_loss"] < 8.0
            assert record[f"moe/layer_{layer}/z_loss"] > 0
        assert 1.0 <= record["moe_max_load"] <= 4.0
        assert record["moe_balance_loss"] == pytest.approx(
            sum(record[f"moe/layer_{i}/balance_loss"] for i in MOE_LAYERS) / 2)
        assert "moe/layer_1/balance_loss" not in record  # a dense layer


@pytest.mark.slow
def test_the_reshard_tool_moves_experts_and_their_optimizer_state_to_one_rank(
        small_data, tmp_path, tp2_pp2):
    *_, step_dir = tp2_pp2
    prefix, tok = small_data
    out = tmp_path / "tp1"
    proc = launch_in_process("tools/ckpts/reshard.py", *MOE,
                             *tiny_overrides(prefix, tok, tmp_path, num_gpus=1, model_parallel_size=1,
                                 pipe_parallel_size=0, train_iters=STEPS, load=step_dir.parent,
                                 save=out))
    assert proc.returncode == 0, explain(proc)
    resharded = full_state(out)
    assert resharded.weights["1.mlp.experts.w_in"].shape[0] == 4  # all four experts
    assert_same_state(full_state(step_dir.parent), resharded)


@pytest.mark.slow
def test_the_reshard_tool_moves_expert_parallel_state_to_one_rank_and_back(
        small_data, tmp_path, ep2_tp2):
    """Out of expert ranks: the experts of each expert rank and their optimizer state (kept by
    expert ranks 1.. in their own files, torch optimizer) merge into one rank's, bit for bit.
    Into expert ranks (ZeRO 1: the experts' state partitioned over their replicas): each rank
    takes its experts' share, and reading it back gives the same state."""
    *_, step_dir = ep2_tp2
    prefix, tok = small_data
    one = tmp_path / "one"
    proc = launch_in_process("tools/ckpts/reshard.py", *MOE,
                             *tiny_overrides(prefix, tok, tmp_path, num_gpus=1, model_parallel_size=1,
                                 pipe_parallel_size=0, train_iters=STEPS, load=step_dir.parent,
                                 save=one))
    assert proc.returncode == 0, explain(proc)
    saved, merged = full_state(step_dir.parent), full_state(one)
    assert merged.state["1.mlp.experts.w_in"]["exp_avg"].shape[0] == 4
    assert_same_state(saved, merged)
    back = tmp_path / "ep2-dp4"
    proc = launch_in_process("tools/ckpts/reshard.py", *MOE,
                             *tiny_overrides(prefix, tok, tmp_path, **EXPERT_PARALLEL["ep2-dp4-zero1"],
                                 train_iters=STEPS, load=one, save=back))
    assert proc.returncode == 0, explain(proc)
    assert_same_state(saved, full_state(back))


def test_a_dense_config_cannot_load_the_moe_checkpoint(small_data, tmp_path, single):
    *_, step_dir = single
    prefix, tok = small_data
    proc = deepy("train.py", "configs/tiny.yml",
                 *tiny_overrides(prefix, tok, tmp_path, load=step_dir.parent,
                                 train_iters=STEPS + 2))
    assert proc.returncode != 0
    assert (f"checkpoint {step_dir} holds another model than this config (moe_num_experts: "
            "checkpoint 4, this run 1; moe_expert_interval: checkpoint 2, this run 1)") \
        in proc.stderr
    assert "launching" not in proc.stderr + proc.stdout  # refused before any worker started
    proc = deepy("generate.py", "configs/tiny.yml", "configs/text_generation.yml",
                 f"load={step_dir.parent}", f"vocab_file={tok}", "save=null",
                 f"sample_output_file={tmp_path / 'samples.jsonl'}")
    assert proc.returncode != 0
    assert f"checkpoint {step_dir} holds another model than this config (moe_num_experts" \
        in proc.stderr
    assert "launching" not in proc.stderr + proc.stdout


def test_stop_and_resume_is_bitwise_identical_with_router_jitter(small_data, tmp_path):
    moe = dict(moe_num_experts=4, moe_top_k=2, moe_expert_interval=2, moe_jitter_eps=0.1,
               moe_aux_loss_coeff=0.01, moe_z_loss_coeff=0.001)
    reference = tmp_path / "uninterrupted"
    proc = run(small_data, reference, **moe)
    assert proc.returncode == 0, explain(proc)
    assert_stop_and_resume_exact(small_data, tmp_path / "resumed",
                                 (losses_by_iteration(reference), reference / "ckpt"), **moe)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_expert_parallel_stop_and_resume_is_bitwise_identical(small_data, tmp_path, precision):
    """Two expert ranks: fp32 on the pipeline engine (a torch optimizer, whose state expert
    rank 1 writes to its own file) and bf16 with ZeRO 1 (the experts' state partitioned)."""
    moe = dict(moe_num_experts=4, moe_top_k=2, moe_expert_interval=2, moe_jitter_eps=0.1,
               moe_aux_loss_coeff=0.01, moe_z_loss_coeff=0.001, num_gpus=2,
               moe_expert_parallel_size=2)
    if precision == "bf16":
        moe.update({"bf16": "{enabled: true}", "pipe_parallel_size": 0,
                    "zero_optimization": "{stage: 1}"})
    reference = tmp_path / "uninterrupted"
    proc = run(small_data, reference, **moe)
    assert proc.returncode == 0, explain(proc)
    assert_stop_and_resume_exact(small_data, tmp_path / "resumed",
                                 (losses_by_iteration(reference), reference / "ckpt"), **moe)


def test_gpt_neox_125m_dmoe_config_trains_in_a_shortened_run(small_data, tmp_path):
    """GPT-NeoX's configs/125M-dmoe.yml as GPT-NeoX ships it (8 experts in every layer, top-1
    Sinkhorn routing, bf16, ZeRO 1, activation checkpointing), on one CPU process with two of
    its twelve layers, 128-token sequences and two steps; the full depth trains the same way,
    in 18 GB of host memory."""
    from tests.runs import NEOX_CONFIGS

    prefix, tok = small_data
    proc = launch_in_process("train.py", str(NEOX_CONFIGS / "125M-dmoe.yml"), *tiny_overrides(
        prefix, tok, tmp_path, hostfile="null", num_gpus=1, num_layers=2, seq_length=128,
        train_micro_batch_size_per_gpu=2, train_batch_size=2, train_iters=2, lr_decay_iters=2,
        split="900,50,50",
        log_interval=1, eval_interval=2, eval_iters=1, checkpoint_factor=2,
        tokenizer_type="HFTokenizer"))
    assert proc.returncode == 0, explain(proc)
    records, validation = read_metrics(tmp_path / "logs")
    assert [r["iteration"] for r in records] == [1, 2] and validation
    for record in records:
        assert math.isfinite(record["lm_loss"])
        shares = [record[f"moe/layer_1/expert_{e}_load"] for e in range(8)]
        assert math.isclose(sum(shares), 1.0, rel_tol=1e-5)
    assert (tmp_path / "ckpt" / "global_step2").is_dir()
