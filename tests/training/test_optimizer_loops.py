"""DeepSpeed's bf16 and ZeRO 1/2 optimizers with their per-parameter loops as multi-tensor ops
(megatron/training/optimizer_loops.py): the same training, bit for bit on a CPU, in far fewer
operator calls."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch

from tests.distributed import run_distributed

# DeepSpeed's BF16_Optimizer steps bf16 pipeline engines at ZeRO 0 (a plain module takes its
# fp16 wrapper), DeepSpeedZeroOptimizer those at ZeRO 1 and 2
LAYOUTS = {"tp2": {"model_parallel_size": 2}, "pp2": {"pipe_parallel_size": 2},
           "dp2": {"pipe_parallel_size": 1},
           "zero1": {"zero_optimization": {"stage": 1}},
           "zero2-tp2": {"pipe_parallel_size": 0, "model_parallel_size": 2,
                         "zero_optimization": {"stage": 2}},
           # bf16 on a plain module: DeepSpeed's fp16 wrapper with a torch optimizer
           "plain": {"pipe_parallel_size": 0},
           "plain-tp2": {"pipe_parallel_size": 0, "model_parallel_size": 2}}
OPTIMIZERS = {"zero1": "DeepSpeedZeroOptimizer", "zero2-tp2": "DeepSpeedZeroOptimizer",
              "plain": "FP16_UnfusedOptimizer", "plain-tp2": "FP16_UnfusedOptimizer"}
CLIPPING = {"clipped": 0.01, "unclipped": 1.0e6}  # every step clips / none does


class OpCount(torch.utils._python_dispatch.TorchDispatchMode):
    """The operators called while it is active, by name (bench/optimizer_ops.py uses it too);
    `computing()` leaves out the views (view, slice, detach, ...), which launch no kernel."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.views: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        if func.is_view:
            self.views.add(str(func))
        return func(*args, **(kwargs or {}))

    def computing(self) -> int:
        return sum(n for name, n in self.ops.items() if name not in self.views)


def _train(rank: int, world: int, tmp: str, layout: str, fused: bool) -> dict:
    import megatron.training.engine as engine_module
    from tests.checkpointing import engines

    if not fused:  # DeepSpeed's own loops
        engine_module.fuse_optimizer_loops = lambda optimizer: False
    out = {"layout": layout}
    for name, clip in CLIPPING.items():
        args = engines.make_args(Path(tmp) / name, bf16={"enabled": True},
                                 gradient_clipping=clip, hidden_dropout=0.0,
                                 **LAYOUTS[layout])
        engine = engines.build(args)
        optimizer = engine.engine.optimizer
        losses = engines.train(engine, args, 3, seed=0)
        norms = [float(optimizer._global_grad_norm)]
        counter = OpCount()
        step = optimizer.step

        def counted_step(*a, **k):
            with counter:
                return step(*a, **k)

        hooks = {"step": counted_step}
        if hasattr(optimizer, "update_hp_grads"):  # BF16_Optimizer: gradients added after backward
            update = optimizer.update_hp_grads

            def counted_update(*a, **k):
                with counter:
                    return update(*a, **k)

            hooks["update_hp_grads"] = counted_update
        for attribute, hook in hooks.items():
            setattr(optimizer, attribute, hook)
        losses += engines.train(engine, args, 1, seed=1)
        groups = (getattr(optimizer, "bf16_groups", None) or getattr(optimizer, "fp16_groups", None)
                  or optimizer.bit16_groups)
        masters = (getattr(optimizer, "fp32_groups_flat_partition", None)
                   or getattr(optimizer, "single_partition_of_fp32_groups", None)
                   or [t for group in optimizer.fp32_groups for t in group])
        out[name] = {"losses": losses, "norm": norms, "weights": engines.weights(engine),
                     "optimizer_ops": counter.ops, "computing": counter.computing(),
                     "params": sum(len(g) for g in groups),
                     "fp32": [t.detach().clone() for t in masters],
                     "optimizer": type(optimizer).__name__}
    return out


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def runs(request, tmp_path_factory):
    layout = request.param
    return {fused: run_distributed(_train, 2, str(tmp_path_factory.mktemp(f"{layout}{fused}")),
                                   layout, fused)
            for fused in (False, True)}


@pytest.mark.slow  # the runs: ten 2-process launches, about 75 s
@pytest.mark.parametrize("clipping", sorted(CLIPPING))
def test_fused_loops_train_bit_for_bit_like_deepspeeds(runs, clipping):
    layout = runs[True][0]["layout"]
    assert runs[True][0][clipping]["optimizer"] == OPTIMIZERS.get(layout, "BF16_Optimizer")
    for rank in (0, 1):
        ours, theirs = runs[True][rank][clipping], runs[False][rank][clipping]
        assert ours["losses"] == theirs["losses"]
        assert ours["norm"] == theirs["norm"]
        assert ours["weights"].keys() == theirs["weights"].keys()
        for name, tensor in ours["weights"].items():
            assert torch.equal(tensor, theirs["weights"][name]), name
        for a, b in zip(ours["fp32"], theirs["fp32"], strict=True):  # the fp32 master weights
            assert torch.equal(a, b)
    if clipping == "clipped":  # the clipping ran: the norm is far above gradient_clipping
        assert runs[True][0][clipping]["norm"][0] > 100 * CLIPPING["clipped"]


@pytest.mark.slow
def test_the_optimizer_step_no_longer_calls_ops_per_parameter(runs):
    for clipping in CLIPPING:
        ours, theirs = runs[True][0][clipping], runs[False][0][clipping]
        params, fused = ours["params"], sum(ours["optimizer_ops"].values())
        # DeepSpeed, a parameter at a time: BF16_Optimizer views and adds its gradient,
        # detaches, casts and takes its norm, detaches and scales it when clipping; ZeRO takes
        # the max and min of its fragment, tests both and adds the result, casts it to fp64
        # and takes its norm
        assert sum(theirs["optimizer_ops"].values()) - fused >= 5 * params
        if ours["optimizer"] == "BF16_Optimizer":  # nothing else there loops: a view a
            # parameter is left, and a fixed number of multi-tensor ops
            assert fused <= params + 60, sorted(ours["optimizer_ops"].items())
        # what is left that computes (views left out) is a fixed number of multi-tensor ops
        # and scalar checks, not a kernel per parameter: about 40 (bf16) and 105 (ZeRO) here at
        # 13 and 28 parameters, and 39 and 103 at 148 in bench/optimizer_ops.py; the fp16
        # wrapper still casts each gradient to fp32 and copies each weight back, 2 a parameter
        left = 2 * params if ours["optimizer"] == "FP16_UnfusedOptimizer" else 0
        assert ours["computing"] <= 120 + left, (params, sorted(ours["optimizer_ops"].items()))


def test_optimizers_without_what_the_fused_loops_read_keep_their_own():
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    from megatron.training.optimizer_loops import fuse

    for kind in (BF16_Optimizer, DeepSpeedZeroOptimizer, FP16_UnfusedOptimizer):
        bare = kind.__new__(kind)  # e.g. another DeepSpeed release's attributes
        assert not fuse(bare)
        assert not {"update_hp_grads", "get_grad_norm_direct",
                    "unscale_and_clip_grads"} & set(vars(bare))
    model = torch.nn.Linear(2, 2)
    assert not fuse(torch.optim.AdamW(model.parameters()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_overflow_check_finds_what_deepspeeds_finds(dtype):
    """any_inf_or_nan (one inf-norm over all gradients) against DeepSpeed's check of each
    gradient, on gradients with +inf, -inf or NaN in one element, with none, and all finite."""
    from deepspeed.runtime.utils import CheckOverflow

    from megatron.training.optimizer_loops import any_inf_or_nan

    def params(bad=None, where=0):
        out = []
        for i, shape in enumerate([(3, 5), (7,), (2, 2, 2), (0,)]):
            p = torch.nn.Parameter(torch.randn(shape).to(dtype))
            p.grad = torch.randn(shape).to(dtype)
            if bad is not None and i == where:
                p.grad.view(-1)[1] = bad
            out.append(p)
        out.append(torch.nn.Parameter(torch.ones(2, dtype=dtype)))  # no gradient
        return out

    checker = CheckOverflow.__new__(CheckOverflow)
    for bad, where in [(None, 0), (float("inf"), 0), (-float("inf"), 1), (float("nan"), 2),
                       (1e4, 1)]:
        group = params(bad, where)
        assert any_inf_or_nan(group) == bool(checker.has_overflow_serial(group)) == \
            (bad is not None and abs(bad) > 1e30 or bad != bad), (bad, where)
    assert any_inf_or_nan([]) is False
