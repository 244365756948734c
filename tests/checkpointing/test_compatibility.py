"""A23: a checkpoint of another layout or shape is refused with every difference named."""

import pytest

from megatron.checkpointing.compatibility import check_compatible, mismatches
from megatron.checkpointing.errors import CheckpointMismatchError

RUN = {"tp": 1, "pp": 1, "pipe_parallel_size": 1, "dp": 2, "world_size": 2, "zero_stage": 0,
       "precision": "fp32", "num_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
       "num_kv_heads": 4, "intermediate_size": 512, "padded_vocab_size": 2048}


def run(**changes):
    return {**RUN, **changes}


def test_the_same_run_loads():
    assert mismatches(RUN, run(), 1, module_only=False) == []


def test_tensor_and_pipeline_degrees_and_shape_must_match_even_for_weights_only():
    found = mismatches(RUN, run(tp=2, pipe_parallel_size=0, hidden_size=256), 1, module_only=True)
    assert found == ["model_parallel_size (tp): checkpoint 1, this run 2",
                     "pipe_parallel_size: checkpoint 1, this run 0",
                     "hidden_size: checkpoint 128, this run 256"]


def test_a_data_parallel_change_loads_with_zero0_fp32_only():
    assert mismatches(RUN, run(dp=1, world_size=1), 1, module_only=False) == []
    bf16 = run(precision="bf16")
    found = mismatches(bf16, run(precision="bf16", dp=1), 1, module_only=False)
    assert len(found) == 1 and "partitioned by data-parallel rank" in found[0]
    zero1 = run(zero_stage=1)
    assert mismatches(zero1, run(zero_stage=1, dp=4), 1, module_only=False)
    assert mismatches(zero1, run(zero_stage=1, dp=4), 1, module_only=True) == []


def test_optimizer_layout_changes_need_a_weights_only_load():
    found = mismatches(RUN, run(zero_stage=1, precision="bf16"), 1, module_only=False)
    assert [f.split(":")[0] for f in found] == ["zero_optimization.stage", "precision"]
    assert mismatches(RUN, run(zero_stage=1, precision="bf16"), 1, module_only=True) == []
    assert "ZeRO stage 3" in mismatches(RUN, run(zero_stage=3), 1, module_only=True)[0]


def test_a_newer_format_is_refused_and_the_error_explains_what_to_do():
    with pytest.raises(CheckpointMismatchError) as err:
        check_compatible(RUN, run(num_layers=2), 2, module_only=False, where="/ck/global_step4")
    text = str(err.value)
    assert "cannot load checkpoint /ck/global_step4" in text
    assert "format_version: checkpoint 2, this code reads up to 1" in text
    assert "num_layers: checkpoint 4, this run 2" in text
    assert "resharding) is not supported yet" in text
