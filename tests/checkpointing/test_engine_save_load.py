"""save_checkpoint / load_checkpoint on real DeepSpeed engines (pipeline, ZeRO 0) in gloo worker
processes: exact continuation, the config options, and the failure paths of a save.

The scenarios run in pairs of gloo worker processes, as many as possible in one pair (starting
one costs seconds; a process holds one process-group layout); each returns what the tests below
assert, or the traceback that broke it.
"""

from __future__ import annotations

import errno
import logging
import os
import traceback
from pathlib import Path

import pytest
import torch

from tests.distributed import run_distributed
from tests.logs import Warnings

# ---- run inside the worker process -------------------------------------------------------


def _draws():
    import random

    import numpy as np

    return (random.random(), float(np.random.rand()), torch.rand(4))


def _same(a, b) -> bool:
    """Exact equality of nested tensors / containers / numbers."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _continuation(directory: Path, **overrides) -> dict:
    """Train 3 steps, save, train 2 more; a fresh engine loads and trains the same 2 steps."""
    from megatron.checkpointing import load_checkpoint, save_checkpoint
    from tests.checkpointing import engines

    args = engines.make_args(directory, **overrides)
    first = engines.build(args)
    engines.train(first, args, 3, seed=0)
    save_checkpoint(first, args.checkpoint, 3, {"consumed_train_samples": 6})
    draws = _draws()
    after_save = {"losses": engines.train(first, args, 2, seed=1),
                  "weights": engines.weights(first)}
    second = engines.build(args)
    resumed = load_checkpoint(second, args.checkpoint)
    loaded_draws = _draws()
    resumed_run = {"losses": engines.train(second, args, 2, seed=1),
                   "weights": engines.weights(second)}
    root = directory / "ckpt"
    return {"resumed": resumed, "same_draws": _same(draws, loaded_draws),
            "same_losses": after_save["losses"] == resumed_run["losses"],
            "same_weights": _same(after_save["weights"], resumed_run["weights"]),
            "lr_steps": second.lr_scheduler.num_steps,
            # (DeepSpeed copies its zero_to_fp32.py scripts beside bf16 / ZeRO checkpoints)
            "listing": sorted(p.name for p in root.iterdir() if p.suffix != ".py"),
            "latest": (root / "latest").read_text(),
            "manifest": (root / "global_step3" / "manifest.json").read_text(),
            "products": [e.model_config.cpu_matmul_precision for e in (first, second)]}


def _options(directory: Path) -> dict:
    from megatron.checkpointing import load_checkpoint, save_checkpoint
    from tests.checkpointing import engines

    out = {}
    args = engines.make_args(directory, no_save_optim=True, no_save_rng=True)
    engine = engines.build(args)
    engines.train(engine, args, 2)
    save_checkpoint(engine, args.checkpoint, 2, {})
    saved = engines.weights(engine)
    fresh = engines.build(args)
    out["no_save_optim"] = {"resumed": load_checkpoint(fresh, args.checkpoint),
                            "weights": _same(saved, engines.weights(fresh)),
                            "optimizer_state": len(fresh.engine.optimizer.state),
                            "lr_steps": fresh.lr_scheduler.num_steps}
    full = engines.make_args(directory / "full")
    engine = engines.build(full)
    for it in (1, 2, 3):
        engines.train(engine, full, 1, seed=it)
        save_checkpoint(engine, full.checkpoint, it, {})
        if it == 2:
            at_two = engines.weights(engine)
    fresh = engines.build(full.replace(iteration=2))
    out["iteration"] = {"resumed": load_checkpoint(fresh, full.replace(iteration=2).checkpoint),
                        "weights": _same(at_two, engines.weights(fresh))}
    tuned = full.replace(finetune=True, save=None)
    fresh = engines.build(tuned)
    out["finetune"] = {"resumed": load_checkpoint(fresh, tuned.checkpoint),
                       "weights": _same(engines.weights(engine), engines.weights(fresh)),
                       "optimizer_state": len(fresh.engine.optimizer.state),
                       "lr_steps": fresh.lr_scheduler.num_steps}
    plain = full.replace(no_load_optim=True, no_load_rng=True, save=None)
    fresh = engines.build(plain)
    seeded = torch.get_rng_state()
    out["no_load_optim_rng"] = {"resumed": load_checkpoint(fresh, plain.checkpoint),
                                "weights": _same(engines.weights(engine), engines.weights(fresh)),
                                "optimizer_state": len(fresh.engine.optimizer.state),
                                "lr_steps": fresh.lr_scheduler.num_steps,
                                "rng_untouched": torch.equal(seeded, torch.get_rng_state())}
    kept = engines.make_args(directory / "kept", keep_last_n_checkpoints=2)
    engine = engines.build(kept)
    for it in (1, 2, 3, 4):
        save_checkpoint(engine, kept.checkpoint, it, {})
    save_checkpoint(engine, kept.checkpoint, 4, {})  # a re-save of the same iteration replaces it
    out["keep_last"] = sorted(p.name for p in (directory / "kept" / "ckpt").iterdir())
    resumed = engines.build(kept)
    # from global_step4, whose files now back its optimizer state
    load_checkpoint(resumed, kept.checkpoint)
    for it in (5, 6, 7):
        save_checkpoint(resumed, kept.checkpoint, it, {})
    out["keep_loaded"] = sorted(p.name for p in (directory / "kept" / "ckpt").iterdir())
    return out


def _expect_save_error(engine, args, iteration) -> str:
    from megatron.checkpointing import CheckpointSaveError, save_checkpoint

    try:
        save_checkpoint(engine, args.checkpoint, iteration, {})
    except CheckpointSaveError as err:
        return str(err)
    return "no error"


def _failures(directory: Path) -> dict:
    from megatron.checkpointing import durable, save as save_module, save_checkpoint
    from tests.checkpointing import engines

    args = engines.make_args(directory)
    root = directory / "ckpt"
    engine = engines.build(args)
    save_checkpoint(engine, args.checkpoint, 1, {})
    out = {}

    real_free = save_module.free_bytes
    save_module.free_bytes = lambda path: 1000
    out["space"] = _expect_save_error(engine, args, 2)
    save_module.free_bytes = real_free
    out["space_listing"] = sorted(p.name for p in root.iterdir())

    os.environ["MEGATRON_CHECKPOINT_FAULT"] = "enospc:rank=0:iteration=2"
    out["enospc"] = _expect_save_error(engine, args, 2)
    del os.environ["MEGATRON_CHECKPOINT_FAULT"]
    out["enospc_listing"] = sorted(p.name for p in root.iterdir())

    real_replace, calls = durable.os.replace, []

    def flaky_replace(src, dst, failures):
        calls.append(src)
        if ".staging-" in str(src) and len(calls) <= failures:
            raise OSError(errno.EIO, "simulated storage hiccup", str(src))
        return real_replace(src, dst)

    durable.os.replace = lambda s, d: flaky_replace(s, d, failures=2)
    save_checkpoint(engine, args.checkpoint, 2, {})
    out["eio_retried"] = (len(calls), (root / "latest").read_text())
    calls.clear()
    durable.os.replace = lambda s, d: flaky_replace(s, d, failures=10**6)
    real_delays, durable.RETRY_DELAYS_S = durable.RETRY_DELAYS_S, (0.001,) * 3
    out["eio_persistent"] = _expect_save_error(engine, args, 3)
    durable.RETRY_DELAYS_S = real_delays
    durable.os.replace = real_replace
    out["eio_listing"] = sorted(p.name for p in root.iterdir())
    return out


def _mismatch(directory: Path) -> str:
    from megatron.checkpointing import CheckpointMismatchError, load_checkpoint, save_checkpoint
    from tests.checkpointing import engines

    args = engines.make_args(directory)
    save_checkpoint(engines.build(args), args.checkpoint, 1, {})
    other = engines.make_args(directory, num_layers=3)
    try:
        load_checkpoint(engines.build(other), other.checkpoint)
    except CheckpointMismatchError as err:
        return str(err)
    return "loaded"


CHANGED_SETTINGS = {"optimizer": {"type": "Adam", "params": {"lr": 2.0e-3, "betas": [0.8, 0.9],
                                                             "eps": 1.0e-4}},
                    "weight_decay": 0.1}


def _changed_settings(directory: Path) -> dict:
    """Saved with tiny.yml's Adam (eps 1e-8, betas (0.9, 0.95), weight decay 0.01), loaded with
    CHANGED_SETTINGS at the saved layout (pipeline; ZeRO 1) and at another (no pipeline, so
    resharded): each loaded optimizer's (settings of every group, lr) and the saved lr."""
    from megatron.checkpointing import load_checkpoint, save_checkpoint
    from tests.checkpointing import engines

    out = {}
    for name, saved_layout, loaded_layout in (
            ("same", {}, {}), ("zero1", LAYOUTS["zero1"], LAYOUTS["zero1"]),
            ("other", {}, {"pipe_parallel_size": 0})):
        args = engines.make_args(directory / name, **saved_layout)
        engine = engines.build(args)
        engines.train(engine, args, 2)
        save_checkpoint(engine, args.checkpoint, 2, {})
        args = engines.make_args(directory / name, **loaded_layout, **CHANGED_SETTINGS)
        loaded = engines.build(args)
        load_checkpoint(loaded, args.checkpoint)
        groups = loaded.engine.optimizer.param_groups
        out[name] = ([(g["eps"], tuple(g["betas"]), g["weight_decay"]) for g in groups],
                     groups[0]["lr"], engine.engine.optimizer.param_groups[0]["lr"])
    return out


def _scenario(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception:  # the test that reads this scenario fails with the traceback
        return {"error": traceback.format_exc()}


LAYOUTS = {"fp32": {}, "bf16": {"bf16": {"enabled": True}},
           "zero1": {"pipe_parallel_size": 0, "zero_optimization": {"stage": 1}},
           "zero3": {"pipe_parallel_size": 0, "zero_optimization": {"stage": 3}},
           "pp2": {"pipe_parallel_size": 2}, "tp2": {"model_parallel_size": 2}}
OTHER = {"options": _options, "failures": _failures, "mismatch": _mismatch,
         "settings": _changed_settings}


def run_scenarios(rank: int, world: int, tmp: str, names: list[str]) -> dict:
    """The named scenarios in this worker (one process-group layout per process, A3), and the
    warnings logged meanwhile."""
    warnings = Warnings()
    logging.getLogger("megatron").addHandler(warnings)
    out = {}
    for name in names:
        directory = Path(tmp) / name
        if name in LAYOUTS:
            out[name] = _scenario(_continuation, directory, **LAYOUTS[name])
        elif name == "damaged_share":
            out[name] = _scenario(_damaged_share, rank, world, directory)
        else:
            out[name] = _scenario(OTHER[name], directory)
    out["warnings"] = warnings.messages
    return out


def _damaged_share(rank: int, world: int, tmp: Path) -> dict:
    """A byte flipped in a file only rank 1 hashes: both ranks reject it and load the older."""
    import torch.distributed as dist

    from megatron.checkpointing import load_checkpoint, save_checkpoint
    from megatron.checkpointing.manifest import assign_files, read_manifest
    from tests.checkpointing import engines

    args = engines.make_args(tmp)
    engine = engines.build(args)
    for it in (1, 2):
        engines.train(engine, args, 1, seed=it)
        save_checkpoint(engine, args.checkpoint, it, {"consumed_train_samples": 4 * it})
    step2 = tmp / "ckpt" / "global_step2"
    victim = sorted(assign_files(read_manifest(step2).files, world)[1])[0]
    if rank == 0:
        data = bytearray((step2 / victim).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (step2 / victim).write_bytes(bytes(data))
    dist.barrier()
    resumed = load_checkpoint(engines.build(args), args.checkpoint)
    return {"resumed": resumed, "victim": victim}


# ---- the tests -----------------------------------------------------------------------------


def position(resumed: dict) -> dict:
    """What a load returned without the step directory it names (LOADED_FROM)."""
    return {k: v for k, v in resumed.items() if k != "loaded_from"}


DP2 = ["fp32", "bf16", "zero1", "zero3", "options", "failures", "mismatch", "damaged_share",
       "settings"]


@pytest.fixture(scope="module")
def dp2(tmp_path_factory):
    """Every scenario that runs on two data-parallel ranks, in one pair of worker processes."""
    return run_distributed(run_scenarios, 2, str(tmp_path_factory.mktemp("dp2")), DP2)


@pytest.fixture
def outcomes(dp2):
    return dp2[0]


def ok(outcome):
    assert not (isinstance(outcome, dict) and "error" in outcome), outcome.get("error")
    return outcome


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_loaded_engine_continues_exactly_like_the_one_that_saved(outcomes, precision):
    out = ok(outcomes[precision])
    assert position(out["resumed"]) == {"consumed_train_samples": 6, "iteration": 3}
    assert out["same_draws"], "RNG states were not restored"
    assert out["same_losses"] and out["same_weights"], "training after the load diverged"
    assert out["lr_steps"] == 5
    assert out["listing"] == ["global_step3", "latest"] and out["latest"] == "global_step3"
    if precision == "bf16":  # cpu_matmul_precision: auto, timed by the first engine, is kept
        import json

        recorded = json.loads(out["manifest"])["run"]["cpu_matmul_precision"]
        assert recorded in ("fp32", "native") and out["products"] == [recorded, recorded]


def test_the_manifest_records_degrees_shape_files_and_client_state(outcomes, tmp_path):
    import json

    manifest = json.loads(ok(outcomes["fp32"])["manifest"])
    assert manifest["run"] == {"tp": 1, "pp": 1, "pipe_parallel_size": 1, "dp": 2,
                               "world_size": 2, "ep": 1, "zero_stage": 0, "precision": "fp32",
                               "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                               "num_kv_heads": 4, "intermediate_size": 256,
                               "padded_vocab_size": 256, "moe_num_experts": 1,
                               "moe_expert_interval": 1, "mamba_layers": [],
                               "mamba_inner_size": 0, "value_head": False}
    assert manifest["client_state"] == {"consumed_train_samples": 6, "iteration": 3}
    assert {"mp_rank_00_model_states.pt", "layer_00-model_00-model_states.pt", "config.yml",
            "rng/rank_0.pt", "rng/rank_1.pt"} <= set(manifest["files"])
    assert manifest["config"]["hidden_size"] == 64 and manifest["contents"]["optimizer"]


def test_no_save_optim_and_no_save_rng_load_with_a_fresh_optimizer_and_say_so(outcomes):
    out = ok(outcomes["options"])["no_save_optim"]
    assert out["resumed"]["iteration"] == 2 and out["weights"]
    assert out["optimizer_state"] == 0 and out["lr_steps"] == 2
    assert any("no optimizer state is loaded (saved with no_save_optim)" in w
               for w in outcomes["warnings"])
    assert any("has no RNG states (saved with no_save_rng)" in w for w in outcomes["warnings"])


def test_a_chosen_iteration_loads_that_checkpoint(outcomes):
    out = ok(outcomes["options"])["iteration"]
    resumed = dict(out["resumed"])
    assert resumed.pop("loaded_from").endswith("/global_step2")
    assert resumed == {"iteration": 2} and out["weights"]


def test_finetune_loads_weights_only_and_restarts_at_iteration_zero(outcomes):
    out = ok(outcomes["options"])["finetune"]
    assert list(out["resumed"]) == ["loaded_from"] and out["weights"]  # no position: restart
    assert out["optimizer_state"] == 0 and out["lr_steps"] == 0


def test_no_load_optim_and_no_load_rng_keep_the_fresh_optimizer_schedule_and_generators(outcomes):
    out = ok(outcomes["options"])["no_load_optim_rng"]
    assert position(out["resumed"]) == {"iteration": 3} and out["weights"]
    assert out["optimizer_state"] == 0 and out["lr_steps"] == 0 and out["rng_untouched"]


def test_keep_last_n_checkpoints_and_a_resave_of_the_same_iteration(outcomes):
    assert ok(outcomes["options"])["keep_last"] == ["global_step3", "global_step4", "latest"]


def test_retention_keeps_the_checkpoint_this_process_loaded(outcomes):
    # its files back memory-mapped optimizer state: deleting them would not free the space
    assert ok(outcomes["options"])["keep_loaded"] == ["global_step4", "global_step6",
                                                       "global_step7", "latest"]


def test_too_little_free_space_aborts_the_save_and_keeps_the_previous(outcomes):
    out = ok(outcomes["failures"])
    assert "global_step2 was not saved" in out["space"]
    assert "has 1,000 bytes free but the checkpoint needs about" in out["space"]
    assert "The previous checkpoint (global_step1) is kept" in out["space"]
    assert out["space_listing"] == ["global_step1", "latest"]


def test_a_full_disk_mid_save_aborts_on_every_rank_and_keeps_the_previous(outcomes):
    out = ok(outcomes["failures"])
    assert "global_step2 was not saved: rank 0: writing" in out["enospc"]
    assert "No space left on device" in out["enospc"]
    assert "latest still names global_step1" in out["enospc"]
    assert out["enospc_listing"] == ["global_step1", "latest"]


def test_transient_rename_errors_are_retried_and_persistent_ones_abort(outcomes):
    out = ok(outcomes["failures"])
    assert out["eio_retried"][1] == "global_step2" and out["eio_retried"][0] >= 3
    assert "global_step3 was not committed" in out["eio_persistent"]
    assert "still failed after 4 attempts" in out["eio_persistent"]
    assert "latest still names global_step2" in out["eio_persistent"]
    assert out["eio_listing"] == ["global_step1", "global_step2", "latest"]


def test_a_checkpoint_of_another_shape_is_refused_with_the_difference(outcomes):
    text = ok(outcomes["mismatch"])
    assert "cannot load checkpoint" in text and "num_layers: checkpoint 2, this run 3" in text


def test_the_configs_optimizer_settings_apply_after_a_load_at_any_layout(outcomes):
    """eps, betas and weight decay come from the config (DeepSpeed's own load would keep the
    checkpoint's at the saved layout, while a resharded load keeps the config's); the learning
    rate stays the checkpoint schedule's."""
    for name, (groups, lr, saved_lr) in ok(outcomes["settings"]).items():
        assert groups == [(1e-4, (0.8, 0.9), 0.1), (1e-4, (0.8, 0.9), 0.0)], name
        assert lr == saved_lr, name
    assert any(w.endswith("global_step2 was trained with other optimizer settings (betas: "
                          "checkpoint (0.9, 0.95), config (0.8, 0.9); eps: checkpoint 1e-08, "
                          "config 0.0001; weight_decay: checkpoint 0.01, config 0.1): this "
                          "run's config applies") for w in outcomes["warnings"])


@pytest.mark.parametrize("layout", ["zero1", "zero3", "pp2", "tp2"])
def test_tensor_pipeline_and_zero_layouts_continue_exactly_after_a_load(tmp_path, dp2, layout):
    results = dp2 if layout in DP2 else run_distributed(run_scenarios, 2, str(tmp_path), [layout])
    for rank, outcome in enumerate(r[layout] for r in results):
        out = ok(outcome)
        assert position(out["resumed"]) == {"consumed_train_samples": 6, "iteration": 3}, rank
        assert out["same_draws"] and out["same_losses"] and out["same_weights"], rank


def test_ranks_agree_to_skip_a_checkpoint_one_of_them_found_damaged(dp2):
    results = [ok(r["damaged_share"]) for r in dp2]
    assert [position(r["resumed"]) for r in results] == \
        [{"consumed_train_samples": 4, "iteration": 1}] * 2
    victim = results[0]["victim"]
    assert any("global_step2 is damaged" in w and victim in w for w in dp2[0]["warnings"])
    assert any("loading" in w and "global_step1 instead" in w for w in dp2[0]["warnings"])
