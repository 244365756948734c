"""log_grad_norm: per-parameter gradient norms on every layout, against the gradients themselves.

Two gloo processes build real DeepSpeed engines of one small model (the same initial weights in
every layout) and take one optimizer step on the same global batch of two micro-batches, with
dropout off and clipping too loose to act. The reference layout (plain module, fp32, two
data-parallel ranks) reads `param.grad` itself just before the optimizer step. Every other
layout must report the same norm under the same canonical name, and in every layout the squares
of the per-parameter norms must add up to the global `grad_norm` squared.

Tolerance: fp32 layouts differ only in the order of floating-point additions (~1e-6 relative),
and DeepSpeed's global norm adds fp32 per-tensor norms (~1e-5 relative), so 1e-4; a missed
tensor-parallel shard or data-parallel fragment changes a norm by a factor up to sqrt(2). bf16
computes activations in bf16, so its norms are compared to fp32 ones loosely (3e-2).
"""

from __future__ import annotations

import math
import traceback
from pathlib import Path

import pytest
import torch

from tests.distributed import run_distributed

DP2 = {"pipe_parallel_size": 0}
LAYOUTS = {
    "plain-dp2": DP2,
    "pipe-dp2": {"pipe_parallel_size": 1},
    "pp2": {"pipe_parallel_size": 2, "gradient_accumulation_steps": 2},
    "tp2": {"model_parallel_size": 2, "gradient_accumulation_steps": 2},
    "zero1": {**DP2, "zero_optimization": {"stage": 1}},
    "zero2": {**DP2, "zero_optimization": {"stage": 2}},
    "zero3": {**DP2, "zero_optimization": {"stage": 3}},
    "bf16": {"pipe_parallel_size": 1, "bf16": {"enabled": True}},
    "plain-dp2-tied": {**DP2, "no_weight_tying": False},
    "pp2-tied": {"pipe_parallel_size": 2, "gradient_accumulation_steps": 2,
                 "no_weight_tying": False},
}
REFERENCE = {"plain-dp2-tied": "plain-dp2-tied", "pp2-tied": "plain-dp2-tied"}
COMMON = {"hidden_dropout": 0.0, "attention_dropout": 0.0, "gradient_clipping": 1e9,
          "log_grad_norm": True}


def _micro_batches(args, dp_rank: int, dp: int):
    """This data-parallel rank's share of one fixed global batch of two micro-batches."""
    from megatron.training.batch import BatchOptions, model_inputs
    from tests.checkpointing.engines import VOCAB

    gen = torch.Generator().manual_seed(7)
    b, s = args.derived.train_micro_batch_size_per_gpu, args.model.seq_length
    texts = [torch.randint(0, VOCAB, (b, s + 1), generator=gen) for _ in range(2)]
    return iter([model_inputs({"text": t}, BatchOptions(eod_token=0))
                 for k, t in enumerate(texts) if k % dp == dp_rank])


def _snapshot_grads(engine) -> dict:
    """Canonical name -> norm of `param.grad` at the first optimizer step (ZeRO 0, fp32 only)."""
    from megatron.model.partition import canonical_param_name

    ds, seen = engine.engine, {}
    step = ds.optimizer.step

    def snapshot_then_step(*args, **kwargs):
        if not seen:
            seen.update({canonical_param_name(n): float(p.grad.norm())
                         for n, p in ds.module.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    ds.optimizer.step = snapshot_then_step
    return seen


def _one_step(run_dir: Path, layout: dict) -> dict:
    import torch.distributed as dist

    from megatron.training.grad_norms import GradNormProbe
    from megatron.training.step import train_step
    from tests.checkpointing import engines

    args = engines.make_args(run_dir, **COMMON, **layout)
    engine = engines.build(args)
    probe = GradNormProbe(engine)
    reference = _snapshot_grads(engine) if layout is DP2 else None
    topology = engine.topology
    data = _micro_batches(args, topology.coords(dist.get_rank()).data, topology.dp)
    probe.arm()
    train_step(engine, data)
    return {"norms": probe.take(), "grad_norm": float(engine.engine.get_global_grad_norm()),
            "reference": reference, "unarmed": _unarmed_step(engine, probe, args)}


def _unarmed_step(engine, probe, args) -> dict:
    """A step that was not armed reads nothing."""
    import torch.distributed as dist

    from megatron.training.step import train_step

    topology = engine.topology
    train_step(engine, _micro_batches(args, topology.coords(dist.get_rank()).data, topology.dp))
    return probe.take()


def run_layouts(rank: int, world: int, tmp: str, names: list[str]) -> dict:
    """The named layouts in this worker (all of one process-group layout, A3)."""
    out = {}
    for name in names:
        try:
            out[name] = _one_step(Path(tmp) / name, LAYOUTS[name])
        except Exception:  # the test of this layout fails with the traceback
            out[name] = {"error": traceback.format_exc()}
    return out


# one pair of worker processes per process-group layout: tp1 x pp1 x dp2, pp2, tp2
PROCESSES = [["plain-dp2", "pipe-dp2", "zero1", "zero2", "zero3", "bf16", "plain-dp2-tied"],
             ["pp2", "pp2-tied"], ["tp2"]]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Rank -> layout -> what that rank saw."""
    by_rank = [{}, {}]
    for names in PROCESSES:
        tmp = str(tmp_path_factory.mktemp("grad_norms"))
        for rank, out in enumerate(run_distributed(run_layouts, 2, tmp, names)):
            by_rank[rank].update(out)
    return by_rank


def ok(result: dict) -> dict:
    assert "error" not in result, result.get("error")
    return result


def test_the_reference_reports_the_norm_of_each_parameters_gradient(results):
    got = ok(results[0]["plain-dp2"])
    names = {k.removeprefix("gradient_norms/") for k in got["norms"]}
    assert names == set(got["reference"]) and len(names) > 10
    for name, norm in got["reference"].items():
        assert got["norms"]["gradient_norms/" + name] == pytest.approx(norm, rel=1e-6)
    assert "gradient_norms/0.word_embeddings.weight" in got["norms"]
    assert "gradient_norms/1.attention.query_key_value.weight" in got["norms"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_squares_add_up_to_the_global_grad_norm(results, layout):
    got = ok(results[0][layout])
    total = math.sqrt(sum(v * v for v in got["norms"].values()))
    assert total == pytest.approx(got["grad_norm"], rel=1e-4)


@pytest.mark.parametrize("layout", [n for n in LAYOUTS if n not in ("plain-dp2", "plain-dp2-tied")])
def test_every_layout_reports_the_reference_norms(results, layout):
    got = ok(results[0][layout])["norms"]
    want = ok(results[0][REFERENCE.get(layout, "plain-dp2")])["norms"]
    assert set(got) == set(want)
    rel = 3e-2 if layout == "bf16" else 1e-4
    for name, norm in want.items():
        assert got[name] == pytest.approx(norm, rel=rel, abs=1e-7), name


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_only_rank_0_holds_the_norms_and_only_for_the_armed_step(results, layout):
    assert ok(results[1][layout])["norms"] == {}
    assert results[0][layout]["unarmed"] == {} and results[1][layout]["unarmed"] == {}
