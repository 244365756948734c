"""Every parallel layout trains the same model as one process: runs of the tiny config's
`deepy.py train.py` launch (its workers forked in-process, tests/runs.py) whose loss traces
(every step) and final weights must match a single-process run.

Tolerance: fp32 with identical initial weights and data; layouts differ only in the order of
floating-point additions (all-reduce sums, split matmuls): ~1e-7 relative per operation. Adam
with its usual eps (1e-8) turns that into O(lr) differences on elements whose gradient is ~1e-8
(rare tokens' embedding rows), since m / (sqrt(v) + eps) is then a sign-like function of the
gradient; these runs therefore use eps = 1e-4, which keeps the update Lipschitz in the gradient
without changing which code runs. We assert losses within 2e-5 relative and every weight
within 2e-5 absolute after six steps (observed: ~1e-6); a wrong shard, a missed or doubled
all-reduce moves weights by lr = 2e-3 per step, a hundred times more.

GPT-2's 50257-id vocabulary, whose padding depends on the tensor-parallel degree, is compared
the same way in tests/checkpointing/test_gpt2_vocab_e2e.py.
"""

import math

import pytest
import torch

from tests.runs import explain, launch_in_process, read_metrics, tiny_overrides
from megatron.checkpointing.weights import full_weights

STEPS = 6
LOSS_RTOL = 2e-5
WEIGHT_ATOL = 2e-5


def overrides(**layout) -> dict:
    """The tiny config's overrides for these runs: STEPS steps, losses logged every step, no
    dropout, Adam eps 1e-4, then `layout`."""
    over = dict(train_iters=STEPS, log_interval=1, eval_interval=1000, eval_iters=1,
                checkpoint_factor=STEPS, hidden_dropout=0.0, attention_dropout=0.0, num_gpus=1,
                seed=1234)
    over["optimizer.params.eps"] = 1e-4
    return {**over, **layout}


def launch(small_data, run_dir, **layout):
    """The `deepy.py train.py` launch of the tiny config with `overrides(**layout)`; the
    finished run."""
    prefix, tok = small_data
    proc = launch_in_process("train.py", "configs/tiny.yml",
                             *tiny_overrides(prefix, tok, run_dir, **overrides(**layout)))
    assert proc.returncode == 0, explain(proc)
    return proc


def train(small_data, run_dir, **layout):
    """(the loss of every step, the final checkpoint) of `launch`."""
    launch(small_data, run_dir, **layout)
    train_records, _ = read_metrics(run_dir / "logs")
    return [r["lm_loss"] for r in train_records], run_dir / "ckpt" / f"global_step{STEPS}"


def assert_trains_like(losses, weights, want_losses, want_weights) -> None:
    """Loss traces within LOSS_RTOL step by step, every weight within WEIGHT_ATOL."""
    for step, (got, want) in enumerate(zip(losses, want_losses, strict=True), start=1):
        assert math.isclose(got, want, rel_tol=LOSS_RTOL), f"step {step}: {got} != {want}"
    assert weights.keys() == want_weights.keys()
    worst = max((weights[k] - w).abs().max().item() for k, w in want_weights.items())
    assert worst < WEIGHT_ATOL, f"largest weight difference {worst:.3g}"


@pytest.fixture(scope="module")
def reference(small_data, tmp_path_factory):
    losses, step_dir = train(small_data, tmp_path_factory.mktemp("single"))
    return losses, full_weights(step_dir)


# tiny.yml fixes the global batch (16) and the micro-batch (8): the single process accumulates
# 2 micro-batches, dp2 layouts none; every layout sees the same 16 sequences per step.
# tensor, pipeline and data parallelism of 2 on their own are parts of the variants below
# (with sequence parallelism, checkpointing, gradient accumulation) and of tp2xpp2xdp2
LAYOUTS = {
    "tp2xpp2": dict(num_gpus=4, model_parallel_size=2, pipe_parallel_size=2),
    "tp2xpp2xdp2": dict(num_gpus=8, model_parallel_size=2, pipe_parallel_size=2),
    "tp2-sequence-parallel": dict(num_gpus=2, model_parallel_size=2, sequence_parallel=True),
    "dp2-micro4-accumulate2": dict(num_gpus=2, train_micro_batch_size_per_gpu=4),
    "activation-checkpointing": dict(checkpoint_activations=True, checkpoint_num_layers=1),
    "pp2-uniform-checkpointing": dict(num_gpus=2, pipe_parallel_size=2, pipe_partition_method="uniform",
                                      checkpoint_activations=True),
    "plain-module-checkpointing": dict(pipe_parallel_size=0, checkpoint_activations=True),
    "tp2-checkpointing-partitioned": dict(num_gpus=2, model_parallel_size=2,
                                          checkpoint_activations=True, partition_activations=True),
    "pp2-checkpointing-contiguous": dict(num_gpus=2, pipe_parallel_size=2,
                                         pipe_partition_method="uniform",
                                         checkpoint_activations=True, partition_activations=True,
                                         contiguous_checkpointing=True),
    "zero1": dict(num_gpus=2, pipe_parallel_size=0, zero_optimization="{stage: 1}"),
    "zero2": dict(num_gpus=2, pipe_parallel_size=0, zero_optimization="{stage: 2}"),
    "zero3": dict(num_gpus=2, pipe_parallel_size=0, zero_optimization="{stage: 3}"),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process(name, reference, small_data, tmp_path):
    ref_losses, ref_weights = reference
    layout = LAYOUTS[name]
    losses, step_dir = train(small_data, tmp_path, **layout)
    assert len(losses) == STEPS
    assert_trains_like(losses, full_weights(step_dir), ref_losses, ref_weights)
    # the run really trained: weights moved far more than the tolerance
    moved = max((ref_weights[k] - w).abs().max().item()
                for k, w in initial_weights(small_data, tmp_path).items())
    assert moved > 100 * WEIGHT_ATOL


def initial_weights(small_data, tmp_path, **layout):
    """The weights every run of `overrides(**layout)` starts from (built in this process)."""
    from megatron.model.gpt import GPTModel
    from megatron.model.config import model_config_from_args
    from megatron.model.partition import canonical_from_module
    from megatron.neox_arguments import NeoXArgs, padded_vocab_size
    from megatron.tokenizer import build_tokenizer

    prefix, tok = small_data
    args = NeoXArgs.from_ymls(["configs/tiny.yml"],
                              tiny_overrides(prefix, tok, tmp_path, **overrides(**layout)))
    vocab = padded_vocab_size(build_tokenizer("HFTokenizer", tok).vocab_size,
                              args.model.make_vocab_size_divisible_by, 1)
    model = GPTModel(model_config_from_args(args, vocab))
    return canonical_from_module(model.state_dict())


def test_tied_embeddings_across_pipeline_stages_match_one_process(small_data, tmp_path):
    """The tied input/output embedding lives on the first and the last stage; DeepSpeed must
    sum its two gradients. pp2 against one process, both tied."""
    ref_losses, ref_dir = train(small_data, tmp_path / "single", no_weight_tying=False)
    losses, step_dir = train(small_data, tmp_path / "pp2", no_weight_tying=False, num_gpus=2,
                             pipe_parallel_size=2)
    ref, got = full_weights(ref_dir), full_weights(step_dir)
    assert "0.word_embeddings.weight" in got and not any(k.startswith("7.") for k in got)
    assert_trains_like(losses, got, ref_losses, ref)
