"""Every post-training objective computes the same model whatever the layout, and resumes
exactly, as pretraining does (tests/e2e/test_equivalence.py): for SFT, DPO, KTO and the reward
model, 6 steps on one process are the reference; tensor x pipeline parallelism (tp2 x pp2, 4
processes) and data parallelism over 2 processes with ZeRO 1 (DPO, KTO), 2 (KTO) and 3 (DPO,
the reward model) log the same loss and metrics at every step (within 2e-5 relative), and a
run resumed from the reference's
checkpoint of step 3 logs exactly the reference's steps 4..6 (DPO reloads the reference model
from the checkpoint recorded at the start, not from the one resumed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.posttraining.runs import posttrain

pytestmark = pytest.mark.slow
OBJECTIVES = ["normal", "dpo", "kto", "rm"]
LAYOUTS = {"tp2xpp2": dict(num_gpus=4, model_parallel_size=2, pipe_parallel_size=2),
           "dp2-zero1": dict(num_gpus=2, zero_optimization="{stage: 1}"),
           # DeepSpeed's pipeline engine takes ZeRO 0 and 1 only: stages 2 and 3 run without one
           "dp2-zero2": dict(num_gpus=2, zero_optimization="{stage: 2}", pipe_parallel_size=0),
           "dp2-zero3": dict(num_gpus=2, zero_optimization="{stage: 3}", pipe_parallel_size=0)}
# an unpadded vocabulary (as GPT-NeoX's post-training configs have it) is the same at every
# tensor-parallel degree, so SFT from scratch starts from the same weights in every layout;
# Adam's eps of 1e-4 for the reason tests/e2e/test_equivalence.py gives
STEPS = {"train_iters": 6, "log_interval": 1, "eval_interval": 100, "eval_iters": 1,
         "checkpoint_factor": 3, "hidden_dropout": 0.0, "attention_dropout": 0.0,
         "make_vocab_size_divisible_by": 1, "optimizer.params.eps": 0.0001}


def trace(run: Path) -> list[dict]:
    """Per step: the loss and every objective metric."""
    lines = (run / "logs" / "metrics.jsonl").read_text().splitlines()
    keep = ("lm_loss", "margins", "reward_acc", "kto_kl", "chosen_rewards", "rejected_rewards",
            "margin", "accuracy", "pos_values", "supervised_tokens", "iteration")
    return [{k: v for k, v in json.loads(line).items() if k in keep}
            for line in lines if '"lm_loss"' in line]


def start_from(impl: str, sft_run: Path) -> dict:
    """SFT starts from scratch; the others fine-tune the SFT model."""
    return {} if impl == "normal" else dict(load=sft_run / "ckpt", finetune=True)


@pytest.fixture(scope="module")
def references(chat_files, sft_run, tmp_path_factory):
    """{objective: run directory} of the one-process runs (checkpoints after steps 3 and 6)."""
    out = {}
    for impl in OBJECTIVES:
        run = tmp_path_factory.mktemp(f"ref_{impl}")
        posttrain(chat_files, run, impl, **{"num_gpus": 1, **STEPS, **start_from(impl, sft_run)})
        out[impl] = run
    return out


def assert_same(got: list[dict], want: list[dict], rel: float = 2e-5) -> None:
    """Each metric within fp32 round-off of the reference's. Values near zero (a reward or a
    margin changing sign) are sums of terms of order 1, so their round-off is absolute: up to
    ~5e-6 between layouts on an AMD EPYC (AVX2), hence abs_tol 1e-5. A layout that drops or
    doubles a reduction is off by far more."""
    assert [r["iteration"] for r in got] == [r["iteration"] for r in want]
    for g, w in zip(got, want):
        for key, value in w.items():
            assert math.isclose(g[key], value, rel_tol=rel, abs_tol=1e-5), (g["iteration"], key,
                                                                             g[key], value)


# every objective at tp2 x pp2 (its loss on the last stage, the reference model and the value
# head split over tensor ranks); data parallelism with ZeRO 1 for the objectives whose metrics
# are reduced over pairs and over the batch (DPO, KTO's KL estimate): SFT's and the reward
# model's reduction is pretraining's, proven in tests/e2e/test_equivalence.py; ZeRO 2 and 3
# (weights partitioned under the policy, the reference model beside it, the value head)
CASES = [(impl, "tp2xpp2") for impl in OBJECTIVES] + [("dpo", "dp2-zero1"), ("kto", "dp2-zero1"),
                                                      ("dpo", "dp2-zero3"), ("kto", "dp2-zero2"),
                                                      ("rm", "dp2-zero3")]


@pytest.mark.parametrize("impl, layout", CASES)
def test_a_parallel_layout_logs_the_steps_of_one_process(chat_files, sft_run, references,
                                                         tmp_path, impl, layout):
    run = tmp_path / "run"
    posttrain(chat_files, run, impl, **{**STEPS, **LAYOUTS[layout], **start_from(impl, sft_run)})
    assert_same(trace(run), trace(references[impl]))


# KTO reloads its reference model as DPO does
@pytest.mark.parametrize("impl", ["normal", "dpo", "rm"])
def test_a_resumed_run_continues_exactly(chat_files, sft_run, references, tmp_path, impl):
    reference = references[impl]
    run = tmp_path / "resumed"
    posttrain(chat_files, run, impl, **{"num_gpus": 1, **STEPS, "load": reference / "ckpt",
                                        "iteration": 3})
    got = trace(run)
    assert [r["iteration"] for r in got] == [4, 5, 6]
    assert got == trace(reference)[3:]  # bit for bit
