"""fp16 with dynamic loss scaling through the training loop (megatron/training/loop.py), in one
real gloo process on CPU: the overflows a run starting at 2^32 meets while the scaler finds its
scale are skipped steps, not bad ones, and the log shows them and the scale, as GPT-NeoX's does;
gradients that overflow at fp16.min_loss_scale stop the run with a message, not a traceback.

Users' fp16 runs need CUDA (deepy.py refuses fp16 on CPU); DeepSpeed's fp16 optimizers are the
same code on any device, so each worker here lifts those refusals (test_fp16_loss_scale.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed import run_distributed
from tests.runs import tiny_overrides
from tests.training.test_fp16_loss_scale import allow_fp16_on_cpu


def _train(rank, world, data: tuple, run: Path, fp16: dict, extra: dict):
    from megatron.neox_arguments import NeoXArgs
    from megatron.safety.guard import TrainingStopped
    from megatron.training.loop import pretrain

    allow_fp16_on_cpu()
    overrides = tiny_overrides(*data, run, num_gpus=1, fp16=json.dumps(fp16), bf16="null",
                               **{"zero_optimization": "{stage: 1}", **extra})
    args = NeoXArgs.from_ymls(["configs/tiny.yml"], overrides).with_world_size(1)
    try:
        state = pretrain(args)
    except TrainingStopped as err:
        return {"stopped": str(err)}
    return {"iteration": state.iteration}


def records(run: Path) -> list[dict]:
    lines = (run / "logs" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "learning_rate" in r]  # training records


def test_overflows_while_the_scale_settles_are_not_bad_steps(small_data, tmp_path, capfd):
    """From 2^32 with hysteresis 2 (DeepSpeed's default), the first dozen or more steps
    overflow in a row: more than max_bad_steps, and any one is a stop under bad_step_policy
    stop. The run trains to the end and saves."""
    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 32, "hysteresis": 2,
            "loss_scale_window": 1000, "min_loss_scale": 1}
    run = tmp_path / "run"
    out = run_distributed(_train, 1, small_data, run, fp16,
                          dict(train_iters=24, log_interval=4, eval_interval=1000,
                               checkpoint_factor=24, bad_step_policy="stop"), join=False)[0]
    console = capfd.readouterr().out
    assert out == {"iteration": 24}, out
    logged = records(run)
    assert [r["iteration"] for r in logged] == [4, 8, 12, 16, 20, 24]
    skipped = [r["skipped_iterations"] for r in logged]
    scales = [r["loss_scale"] for r in logged]
    # every step of the first interval overflowed; the scale halves from the second overflow
    assert skipped[0] == 4 and scales[0] == 2.0 ** 29, (skipped, scales)
    assert sum(skipped) > 10 and skipped[-1] == 0, skipped
    assert scales == sorted(scales, reverse=True) and scales[-1] == scales[-2] < 2.0 ** 24, scales
    first = next(ln for ln in console.splitlines() if ln.startswith(" iteration      4/24 "))
    # as GPT-NeoX: the loss is the mean of the applied steps, and this interval has none
    assert f" | lm_loss - (no step applied) | " in first, first
    assert f" | loss scale {2 ** 29:,} | skipped 4 | " in first, first
    assert "lm_loss" not in logged[0], logged[0]
    last = next(ln for ln in console.splitlines() if ln.startswith(" iteration     24/24 "))
    assert " | loss scale " in last and " skipped " not in last, last
    assert "bad step" not in console and "not applied" not in console, console
    assert (run / "ckpt" / "latest").read_text() == "global_step24"
    losses = [r["lm_loss"] for r in logged if "lm_loss" in r]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses


def test_overflow_at_the_minimum_loss_scale_stops_the_run_with_its_reason(small_data, tmp_path):
    """min_loss_scale 2^29 with initial 2^32: the fourth overflow comes at the minimum."""
    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 32, "hysteresis": 1,
            "loss_scale_window": 1000, "min_loss_scale": 2 ** 29}
    run = tmp_path / "run"
    out = run_distributed(_train, 1, small_data, run, fp16,
                          dict(train_iters=8, log_interval=1, eval_interval=1000,
                               checkpoint_factor=1000), join=False)[0]
    assert out == {"stopped": (
        "training stopped: iteration 4: the gradients overflow fp16 at its minimum loss scale "
        "(fp16.min_loss_scale 536870912), so no step can be applied. Lower the learning rate, "
        "or train in bf16. no good checkpoint was saved")}, out
