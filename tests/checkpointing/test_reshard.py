"""Loading a checkpoint into another parallel layout (reshard.py) on real DeepSpeed engines.

Each scenario trains at layout A and saves, then a second set of worker processes builds
layout B, loads (resharding), evaluates the loss of a fixed batch, saves again at once and
trains on. The full state read back from both checkpoints must be bitwise identical (weights,
fp32 master copies, the optimizer's declared state such as Adam's moments or SGD's momentum
buffer, step, LR schedule): nothing is lost or reordered; a bf16 checkpoint loaded at fp32
takes its weights from the fp32 master copies, not the rounded ones. The loss of the fixed
batch and the continued training match layout A's own continuation up to the summation-order
differences of other tensor-parallel splits.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from pathlib import Path

import pytest
import torch

from tests.distributed import run_distributed

STEPS_BEFORE, STEPS_AFTER = 2, 3

# ---- run inside the worker processes ------------------------------------------------------


def _layout(tp: int, pp: int, **extra) -> dict:
    return {"model_parallel_size": tp, "pipe_parallel_size": pp, **extra}


def _fixed_batch(args):
    from megatron.training.batch import BatchOptions, model_inputs

    gen = torch.Generator().manual_seed(999)
    b, s = args.derived.train_micro_batch_size_per_gpu, args.model.seq_length
    return model_inputs({"text": torch.randint(0, 256, (b, s + 1), generator=gen)},
                        BatchOptions(eod_token=0))


def _scenario(rank, world, run_dir, layout, load_from, save_to, steps_after):
    """Build `layout`, load `load_from` (if any), record the fixed batch's loss, save to
    `save_to`, train `steps_after` steps continuing the data stream; returns (eval loss,
    losses, warnings)."""
    from megatron.checkpointing import load_checkpoint, save_checkpoint
    from megatron.training.step import eval_step
    from tests.checkpointing import engines

    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("megatron").addHandler(handler)
    args = engines.make_args(Path(run_dir), hidden_dropout=0.0, save=str(save_to),
                             load=str(load_from) if load_from else None, **layout)
    engine = engines.build(args)
    before = 0
    if load_from is None:
        engines.train(engine, args, STEPS_BEFORE)
    else:
        before = load_checkpoint(engine, args.checkpoint)["iteration"]
    loss = eval_step(engine, iter([_fixed_batch(args)] * 8))
    save_checkpoint(engine, args.checkpoint, STEPS_BEFORE, {"consumed_train_samples": 0})
    import torch.distributed as dist

    data = engines.batches(0, args, engine.topology.coords(dist.get_rank()).data)
    for _ in itertools.islice(data, STEPS_BEFORE):
        pass  # the batches layout A trained on before saving
    from megatron.training.step import train_step

    losses = [train_step(engine, data) for _ in range(steps_after)]
    return loss, losses, warnings, before


# ---- the tests --------------------------------------------------------------------------


def full_state(directory: Path, tag: str | None = None):
    """The layout-free state of the checkpoint `tag` (default: the latest) under `directory`."""
    from megatron.checkpointing.layout import read_latest
    from megatron.checkpointing.manifest import read_manifest
    from megatron.checkpointing.reshard import read_full_state

    step = directory / (tag or read_latest(directory))
    return read_full_state(step, read_manifest(step), with_optimizer=True)


def assert_same_state(a, b):
    """Bitwise equal exact weights (the fp32 master copy where there is one), optimizer state,
    step, LR schedule and counters."""
    assert a.weights.keys() == b.weights.keys()
    for name in a.weights:
        exact_a, exact_b = (s.master.get(name, s.weights[name]) for s in (a, b))
        assert torch.equal(exact_a, exact_b), name
        if a.weights[name].dtype == b.weights[name].dtype:
            assert torch.equal(a.weights[name], b.weights[name]), name
    assert a.state.keys() == b.state.keys() == a.weights.keys()
    assert a.state_keys == b.state_keys and a.state_keys  # the declared tensors, all carried
    for name in a.state:
        assert a.state[name].keys() == set(a.state_keys)
        for key in a.state_keys:
            assert torch.equal(a.state[name][key], b.state[name][key]), (name, key)
    for name in a.master.keys() & b.master.keys():
        assert torch.equal(a.master[name], b.master[name]), name
    assert (a.step is None and b.step is None) or float(a.step) == float(b.step)
    assert a.lr_scheduler == b.lr_scheduler and a.counters == b.counters


LLAMA = dict(norm="rmsnorm", activation="swiglu", num_kv_heads=2, rotary_pct=1.0,
             mlp_multiple_of=32, use_bias_in_norms=False, use_bias_in_attn_linear=False,
             use_bias_in_mlp=False)
SGD = {"optimizer": {"type": "sgd", "params": {"lr": 0.05, "momentum": 0.9}}}
CASES = {
    # saved layout (world), loaded layout (world), loss tolerance
    "tp2xpp2_to_tp1xpp1": ((4, _layout(2, 2)), (1, _layout(1, 1)), 2e-5),
    "tp1_to_tp2_bf16": ((1, _layout(1, 1, bf16={"enabled": True})),
                        (2, _layout(2, 1, bf16={"enabled": True})), 2e-2),
    "tp2_bf16_to_pp2_fp32": ((2, _layout(2, 1, bf16={"enabled": True})), (2, _layout(1, 2)),
                             2e-2),
    "llama_gqa_swiglu_tp2_to_tp1": ((2, _layout(2, 1, **LLAMA)), (1, _layout(1, 1, **LLAMA)),
                                    2e-5),
    "zero3_tp2_dp2_to_pp2": ((4, _layout(2, 0, zero_optimization={"stage": 3})),
                             (2, _layout(1, 2)), 2e-5),
    "tp2_bf16_to_zero3_dp2_bf16": ((2, _layout(2, 1, bf16={"enabled": True})),
                                   (2, _layout(1, 0, bf16={"enabled": True},
                                               zero_optimization={"stage": 3})), 2e-2),
    "pp2_tied_to_pp1_zero1_dp2": ((2, _layout(1, 2, no_weight_tying=False)),
                                  (2, _layout(1, 1, no_weight_tying=False,
                                              zero_optimization={"stage": 1})), 2e-5),
    # SGD declares its momentum buffer, which is carried like Adam's moments
    "sgd_momentum_tp2_to_tp1": ((2, _layout(2, 1, **SGD)), (1, _layout(1, 1, **SGD)), 2e-5),
    "sgd_momentum_zero1_dp2_to_tp2": ((2, _layout(1, 1, zero_optimization={"stage": 1}, **SGD)),
                                      (2, _layout(2, 1, **SGD)), 2e-5),
}


@pytest.mark.parametrize("case", CASES)
def test_a_checkpoint_loads_into_another_layout_and_training_continues(case, tmp_path):
    (world_a, layout_a), (world_b, layout_b), tol = CASES[case]
    saved, resaved = tmp_path / "a", tmp_path / "b"
    same_data = world_a // (layout_a["model_parallel_size"] * max(1, layout_a[
        "pipe_parallel_size"])) == world_b // (layout_b["model_parallel_size"] * max(
            1, layout_b["pipe_parallel_size"]))
    ref = run_distributed(_scenario, world_a, str(tmp_path), layout_a, None, saved, STEPS_AFTER)
    out = run_distributed(_scenario, world_b, str(tmp_path), layout_b, saved, resaved,
                          STEPS_AFTER)
    (ref_eval, ref_losses, _, _), (got_eval, got_losses, warnings, iteration) = ref[0], out[0]
    assert iteration == STEPS_BEFORE
    assert any(w.startswith(f"resharded {saved / 'global_step2'} into this run's layout")
               and "weights, optimizer state loaded" in w for w in warnings), warnings
    assert_same_state(full_state(saved), full_state(resaved))
    if "optimizer" in layout_a:  # SGD keeps no step count
        assert full_state(saved).state_keys == ("momentum_buffer",)
    else:
        assert float(full_state(resaved).step) == STEPS_BEFORE
    assert abs(got_eval - ref_eval) < tol * abs(ref_eval)
    if same_data:  # the same batches: the continued losses track layout A's own
        assert got_losses == pytest.approx(ref_losses, rel=tol)
    assert all(torch.isfinite(torch.tensor(got_losses)))


def _weights_only(rank, world, run_dir):
    """A weights-only checkpoint (as convert_hf_to_neox.py writes, split for tp=2) loaded by a
    pipeline-parallel run: (every local parameter equals its part of the written weights,
    optimizer entries, iteration, warnings)."""
    import torch.distributed as dist

    from megatron.checkpointing import load_checkpoint
    from megatron.checkpointing.weights_only import write_weights_checkpoint
    from megatron.model.config import model_config_from_args
    from megatron.model.gpt import GPTModel
    from megatron.model.partition import canonical_from_module, canonical_param_name
    from tests.checkpointing import engines

    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("megatron").addHandler(handler)
    args = engines.make_args(Path(run_dir), pipe_parallel_size=2, load=str(Path(run_dir) / "w"))
    engine = engines.build(args)
    config = model_config_from_args(args, engines.VOCAB)
    canonical = canonical_from_module(GPTModel(dataclasses.replace(config, seed=99)).state_dict())
    if rank == 0:  # the config says tp 1 x pp 2 over 2 ranks; the checkpoint records tp 2
        write_weights_checkpoint(Path(run_dir) / "w", 7, canonical, args, tp=2)
    dist.barrier()
    resumed = load_checkpoint(engine, args.checkpoint)
    same = [torch.equal(p, canonical[canonical_param_name(n)])
            for n, p in engine.engine.module.named_parameters()]
    return all(same) and len(same) > 0, len(engine.engine.optimizer.state), resumed, warnings


def test_a_weights_only_checkpoint_loads_into_any_layout_with_a_fresh_optimizer(tmp_path):
    results = run_distributed(_weights_only, 2, str(tmp_path))
    for same, optimizer_entries, resumed, _ in results:
        assert same and optimizer_entries == 0 and resumed["iteration"] == 7
        assert resumed["loaded_from"].endswith("/global_step7") and len(resumed) == 2
    warnings = results[0][3]  # rank 0 logs for all
    assert any("no optimizer state is loaded (written from weights alone)" in w for w in warnings)
    assert any("model_parallel_size (tp): checkpoint 2, this run 1" in w
               and w.endswith("): weights loaded; random generators keep their seeded state")
               for w in warnings), "\n".join(warnings)
