"""DeepSpeed's bf16 optimizer with its per-parameter loops as multi-tensor ops
(megatron/training/bf16_loops.py): the same training, bit for bit on a CPU, in far fewer
operator calls."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch

from tests.distributed import run_distributed

# DeepSpeed's BF16_Optimizer steps pipeline engines at ZeRO 0 (a plain module takes another)
LAYOUTS = {"tp2": {"model_parallel_size": 2}, "pp2": {"pipe_parallel_size": 2},
           "dp2": {"pipe_parallel_size": 1}}
CLIPPING = {"clipped": 0.01, "unclipped": 1.0e6}  # every step clips / none does


class _Count(torch.utils._python_dispatch.TorchDispatchMode):
    """The operators called while it is active, by name."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _train(rank: int, world: int, tmp: str, layout: str, fused: bool) -> dict:
    import megatron.training.engine as engine_module
    from tests.checkpointing import engines

    if not fused:  # DeepSpeed's own loops
        engine_module.fuse_bf16_loops = lambda optimizer: False
    out = {}
    for name, clip in CLIPPING.items():
        args = engines.make_args(Path(tmp) / name, bf16={"enabled": True},
                                 gradient_clipping=clip, hidden_dropout=0.0,
                                 **LAYOUTS[layout])
        engine = engines.build(args)
        optimizer = engine.engine.optimizer
        losses = engines.train(engine, args, 3, seed=0)
        norms = [float(optimizer._global_grad_norm)]
        counter = _Count()
        step = optimizer.step

        def counted_step(*a, **k):
            with counter:
                return step(*a, **k)

        update = optimizer.update_hp_grads

        def counted_update(*a, **k):
            with counter:
                return update(*a, **k)

        optimizer.step, optimizer.update_hp_grads = counted_step, counted_update
        losses += engines.train(engine, args, 1, seed=1)
        out[name] = {"losses": losses, "norm": norms, "weights": engines.weights(engine),
                     "optimizer_ops": counter.ops, "params": sum(len(g) for g in
                                                                 optimizer.bf16_groups),
                     "fp32": [t.detach().clone() for t in optimizer.fp32_groups_flat_partition]}
    return out


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def runs(request, tmp_path_factory):
    layout = request.param
    return {fused: run_distributed(_train, 2, str(tmp_path_factory.mktemp(f"{layout}{fused}")),
                                   layout, fused)
            for fused in (False, True)}


@pytest.mark.parametrize("clipping", sorted(CLIPPING))
def test_fused_loops_train_bit_for_bit_like_deepspeeds(runs, clipping):
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


def test_the_optimizer_step_no_longer_calls_ops_per_parameter(runs):
    for clipping in CLIPPING:
        ours, theirs = runs[True][0][clipping], runs[False][0][clipping]
        params = ours["params"]
        # DeepSpeed, a parameter at a time: view and add its gradient; detach, cast and take
        # its norm; detach and scale it when clipping
        assert sum(theirs["optimizer_ops"].values()) >= 7 * params
        # fused: a view a parameter, and a fixed number of multi-tensor ops
        assert sum(ours["optimizer_ops"].values()) <= params + 60, \
            sorted(ours["optimizer_ops"].items())
