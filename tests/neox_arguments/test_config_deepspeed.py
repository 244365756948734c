"""deepspeed_config(args): the one DeepSpeed JSON config, and DeepSpeed's own parser accepts it."""

from __future__ import annotations

import pytest

from neox_args_helpers import DATA, REPO, make

from megatron.neox_arguments import NeoXArgs, deepspeed_config


def test_tiny_config():
    args = NeoXArgs.from_ymls([REPO / "configs/tiny.yml"])
    assert deepspeed_config(args) == {
        "train_batch_size": 16,
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 0},
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }


def test_neox_125m_config():
    ds = deepspeed_config(NeoXArgs.from_ymls([DATA / "neox_125M.yml"]).with_world_size(8))
    assert (ds["train_batch_size"], ds["gradient_accumulation_steps"]) == (32, 1)
    assert ds["fp16"] == {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}
    assert ds["zero_optimization"]["stage"] == 1 and ds["zero_optimization"]["overlap_comm"]
    assert ds["activation_checkpointing"] == {
        "partition_activations": True, "contiguous_memory_optimization": False,
        "cpu_checkpointing": False, "synchronize_checkpoint_boundary": True,
        "number_checkpoints": 12,
    }
    assert "bf16" not in ds and "optimizer" not in ds and "scheduler" not in ds


def test_neox_bf16_spellings_become_bf16():
    ds = deepspeed_config(NeoXArgs.from_ymls([DATA / "neox_pythia_1B.yml"]))
    assert ds["bf16"] == {"enabled": True} and "fp16" not in ds
    assert ds["communication_data_type"] == "fp32"  # fp32_allreduce
    assert deepspeed_config(make(precision="bf16"))["bf16"] == {"enabled": True}


def test_neox_extra_fp16_keys_are_dropped_and_extra_args_merged():
    ds = deepspeed_config(make(fp16={"fp16": True, "enabled": True, "initial_scale_power": 12},
                               deepspeed_extra_args={"comms_logger": {"enabled": True}}))
    assert ds["fp16"] == {"enabled": True, "initial_scale_power": 12}
    assert ds["comms_logger"] == {"enabled": True}
    assert "communication_data_type" not in deepspeed_config(make(fp32_allreduce=True))


def test_data_types_reach_deepspeed():
    from deepspeed.runtime.config import DeepSpeedConfig  # imports torch: test only

    args = make(precision="bf16", zero_optimization={"stage": 1},
                data_types={"grad_accum_dtype": "fp32"})
    ds = deepspeed_config(args)
    assert ds["data_types"] == {"grad_accum_dtype": "fp32"}
    assert DeepSpeedConfig(ds).grad_accum_dtype == "fp32"
    assert "data_types" not in deepspeed_config(make())


CONFIGS = [REPO / "configs/tiny.yml", REPO / "configs/125M.yml", REPO / "configs/pythia/1B.yml",
           DATA / "neox_125M.yml", DATA / "neox_pythia_1B.yml"]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_deepspeed_parses_our_config(path):
    from deepspeed.runtime.config import DeepSpeedConfig  # imports torch: test only

    args = NeoXArgs.from_ymls([path]).with_world_size(1)
    parsed = DeepSpeedConfig(deepspeed_config(args))
    assert parsed.train_batch_size == args.derived.train_batch_size
    assert parsed.zero_optimization_stage == args.zero_stage
    assert parsed.float16_config.enabled == (args.derived.precision == "fp16")
    assert parsed.bfloat16_config.enabled == (args.derived.precision == "bf16")
