"""A23: a checkpoint of another model shape is refused with every difference named; another
layout is named as the changes resharding handles."""

import pytest

from megatron.checkpointing.compatibility import check_compatible, layout_changes, mismatches
from megatron.checkpointing.errors import CheckpointMismatchError

RUN = {"tp": 1, "pp": 1, "pipe_parallel_size": 1, "dp": 2, "world_size": 2, "zero_stage": 0,
       "precision": "fp32", "num_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
       "num_kv_heads": 4, "intermediate_size": 512, "padded_vocab_size": 2048}


def run(**changes):
    return {**RUN, **changes}


def test_the_same_run_loads():
    assert mismatches(RUN, run(), 1) == [] and layout_changes(RUN, run()) == []


def test_another_model_shape_is_refused_even_at_the_same_layout():
    found = mismatches(RUN, run(tp=2, pipe_parallel_size=0, hidden_size=256), 1)
    assert found == ["hidden_size: checkpoint 128, this run 256"]


def test_other_degrees_zero_stages_and_precisions_are_layout_changes_to_reshard():
    changed = run(tp=2, pipe_parallel_size=0, zero_stage=1, precision="bf16", dp=1)
    assert mismatches(RUN, changed, 1) == []
    assert layout_changes(RUN, changed) == [
        "model_parallel_size (tp): checkpoint 1, this run 2",
        "pipe_parallel_size: checkpoint 1, this run 0",
        "zero_optimization.stage: checkpoint 0, this run 1",
        "precision: checkpoint fp32, this run bf16",
        "data-parallel size: checkpoint 2, this run 1"]


def test_a_data_parallel_change_deepspeed_loads_itself_is_not_a_layout_change():
    assert layout_changes(RUN, run(dp=1, world_size=1)) == []  # ZeRO 0, fp32: one state
    bf16 = run(precision="bf16")
    assert layout_changes(bf16, run(precision="bf16", dp=1)) == [
        "data-parallel size: checkpoint 2, this run 1"]


def test_zero3_is_a_layout_like_the_others():
    zero3 = run(zero_stage=3)
    assert mismatches(zero3, run(tp=2), 1) == []
    assert layout_changes(zero3, run(zero_stage=3, dp=1)) == [
        "data-parallel size: checkpoint 2, this run 1"]


def test_a_newer_format_is_refused_and_the_error_explains_what_to_do():
    with pytest.raises(CheckpointMismatchError) as err:
        check_compatible(RUN, run(num_layers=2), 2, where="/ck/global_step4")
    text = str(err.value)
    assert "cannot load checkpoint /ck/global_step4" in text
    assert "format_version: checkpoint 2, this code reads up to 1" in text
    assert "num_layers: checkpoint 4, this run 2" in text
    assert "The model shape must match the checkpoint's" in text
