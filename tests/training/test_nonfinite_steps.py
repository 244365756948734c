"""fp32 without ZeRO (DeepSpeed's plain torch optimizer): a step whose gradients hold inf or NaN
is not applied, counted in skipped_steps, and leaves the weights as they were; a step whose
clipping norm is finite is known to be finite from that norm, without a second pass over every
gradient (what the element-wise check costs: about 2% of a 125M-class fp32 step on a CPU)."""

from __future__ import annotations

from tests.distributed import run_distributed


def _steps(rank, world, run_dir):
    from pathlib import Path

    import torch

    import megatron.safety.guard as guard
    from tests.checkpointing.engines import build, make_args, train, weights

    checked = []
    element_check = guard.all_finite
    guard.all_finite = lambda tensors: checked.append(len(tensors)) or element_check(tensors)
    args = make_args(Path(run_dir), hidden_dropout=0.0, gradient_clipping=1.0)
    engine = build(args)
    ds = engine.engine
    before = weights(engine)
    train(engine, args, 1)
    after_good = weights(engine)
    good = (ds.skipped_steps, list(checked),
            any(not torch.equal(before[k], after_good[k]) for k in before))
    param = next(p for p in ds.module.parameters() if p.requires_grad)
    hook = param.register_hook(lambda grad: torch.full_like(grad, float("nan")))
    train(engine, args, 1, seed=1)
    hook.remove()
    after_bad = weights(engine)
    bad = (ds.skipped_steps, len(checked),
           all(torch.equal(after_good[k], after_bad[k]) for k in after_good))
    return good, bad


def test_a_nan_gradient_skips_the_step_and_a_finite_norm_spares_the_second_pass(tmp_path):
    [(good, bad)] = run_distributed(_steps, 1, str(tmp_path))
    skipped, checked, moved = good
    assert (skipped, checked, moved) == (0, [], True)
    skipped, checked, unchanged = bad
    assert (skipped, unchanged) == (1, True)
    assert checked == 1  # the NaN norm sent the step to the element-wise check
