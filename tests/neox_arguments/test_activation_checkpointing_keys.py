"""Activation checkpointing keys that could not act are refused by name; the ones that act reach
DeepSpeed's JSON with the number of checkpoints checkpoint_num_layers gives."""

from __future__ import annotations

import pytest

from neox_args_helpers import make

from megatron.neox_arguments import ConfigError, deepspeed_config


@pytest.mark.parametrize("key", ["partition_activations", "contiguous_checkpointing",
                                 "checkpoint_in_cpu", "synchronize_each_layer"])
def test_option_without_checkpoint_activations_is_accepted_and_said_to_change_nothing(key):
    """GPT-NeoX accepts them (its pythia/14M.yml and 31M.yml set synchronize_each_layer with
    checkpointing off); the run's start-up says each changes nothing."""
    from megatron.model.recompute import idle_checkpointing_options

    args = make(**{key: True})
    assert getattr(args.parallelism, key) is True
    assert "activation_checkpointing" not in deepspeed_config(args)  # nothing to configure
    assert idle_checkpointing_options(args.parallelism) == [
        f"{key} is true but checkpoint_activations is false: nothing is checkpointed, so it "
        "changes nothing in this run (set checkpoint_activations: true for it to act)"]
    acting = make(**{"checkpoint_activations": True, "partition_activations": True, key: True})
    assert idle_checkpointing_options(acting.parallelism) == []


def test_contiguous_checkpointing_needs_partition_activations():
    with pytest.raises(ConfigError) as e:
        make(checkpoint_activations=True, contiguous_checkpointing=True)
    assert ("contiguous_checkpointing is true but partition_activations is false; DeepSpeed "
            "copies only partitioned checkpoints into its contiguous buffers") in str(e.value)


def test_checkpoint_num_layers_below_one_is_refused():
    with pytest.raises(ConfigError, match=r"checkpoint_num_layers\(0\) must be at least 1"):
        make(checkpoint_activations=True, checkpoint_num_layers=0)


def test_activation_checkpointing_inside_deepspeed_extra_args_is_refused():
    """DeepSpeed's engine never reads that section; the dedicated keys configure it."""
    with pytest.raises(ConfigError) as e:
        make(deepspeed_extra_args={"activation_checkpointing": {"partition_activations": True}})
    assert "deepspeed_extra_args.activation_checkpointing would replace the value generated " \
           "from checkpoint_activations" in str(e.value)


def test_every_option_together_is_accepted_and_counts_checkpoints_per_group():
    args = make(checkpoint_activations=True, checkpoint_num_layers=2, num_layers=3,
                partition_activations=True, contiguous_checkpointing=True,
                checkpoint_in_cpu=True, synchronize_each_layer=True)
    assert deepspeed_config(args)["activation_checkpointing"] == {
        "partition_activations": True, "contiguous_memory_optimization": True,
        "cpu_checkpointing": True, "synchronize_checkpoint_boundary": True,
        "number_checkpoints": 2,
    }
