"""With one data-parallel replica the gradients' all-reduce is skipped (docs/train.md;
megatron/training/engine.py replaces DeepSpeed's `_reduce_non_expert_gradients` on the
engine): the method it replaces is still DeepSpeed's, at the same signature, so the skip does
not silently become a no-op; skipping changes no weight; two replicas still reduce."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from tests.distributed import run_distributed

REPLACED = "_reduce_non_expert_gradients"


def _train(rank: int, world: int, tmp: str) -> dict:
    from tests.checkpointing import engines

    args = engines.make_args(Path(tmp))
    found = {}
    for reduce in (False, True):
        engine = engines.build(args)
        skipped = REPLACED in vars(engine.engine)
        if reduce and skipped:
            del engine.engine.__dict__[REPLACED]  # DeepSpeed's own reduction, over one replica
        losses = engines.train(engine, args, 3)
        found[reduce] = (skipped, losses, engines.weights(engine))
    return found


def test_deepspeed_still_reduces_gradients_through_the_replaced_method():
    from deepspeed.runtime.engine import DeepSpeedEngine

    method = getattr(DeepSpeedEngine, REPLACED)
    assert list(inspect.signature(method).parameters) == ["self", "grads", "elements_per_buffer"]
    assert f"self.{REPLACED}(" in inspect.getsource(DeepSpeedEngine.buffered_allreduce_fallback)


def test_one_replica_skips_the_reduction_with_the_same_weights_and_two_do_not(tmp_path):
    (one,) = run_distributed(_train, 1, str(tmp_path / "one"))
    (skipped, losses, weights), (_, reduced_losses, reduced_weights) = one[False], one[True]
    assert skipped
    assert losses == reduced_losses
    assert all(torch.equal(weights[k], reduced_weights[k]) for k in weights)
    two = run_distributed(_train, 2, str(tmp_path / "two"))
    assert [rank[False][0] for rank in two] == [False, False]
