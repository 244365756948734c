"""Mamba keys and layouts are checked before any worker starts, each problem in one line
naming the keys and values."""

from __future__ import annotations

import pytest

from neox_args_helpers import REPO

from megatron.neox_arguments import ConfigError, NeoXArgs

TINY = REPO / "configs/tiny.yml"
MAMBA = REPO / "configs/tiny_mamba.yml"


def problems(files=(TINY,), **overrides) -> str:
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls(list(files), overrides)
    return str(e.value)


def test_tiny_mamba_config_mixes_mamba_and_attention_layers():
    args = NeoXArgs.from_ymls([TINY, MAMBA])
    assert args.derived.attention_types == ("mamba", "mamba", "global", "mamba")
    assert args.derived.mamba_inner_size == 2 * args.model.hidden_size


@pytest.mark.parametrize("key,value", [("mamba_use_bias_in_conv", False),
                                       ("mamba_selective_scan_fusion", True)])
def test_mamba_keys_on_an_attention_only_config_are_refused(key, value):
    assert (f"{key} is {value!r} but attention_config has no mamba layers, so it acts on "
            "nothing: add mamba layers to attention_config") in problems(**{key: value})


def test_mamba_channels_must_split_over_tensor_ranks():
    msg = problems((TINY, MAMBA), model_parallel_size=2, intermediate_size=129)
    assert ("Mamba layers have 129 channels (intermediate_size, else 2 * hidden_size) but "
            "model_parallel_size is 2: the channels must divide over the tensor-parallel "
            "ranks") in msg


def test_what_mamba_layers_do_not_take_is_refused_by_name():
    assert "sequence_parallel with mamba layers is not implemented" in problems(
        (TINY, MAMBA), model_parallel_size=2, sequence_parallel=True)
    assert "moe_num_experts > 1 with mamba layers is not implemented" in problems(
        (TINY, MAMBA), moe_num_experts=4)
    assert "zero_optimization.stage 3 with mamba layers is refused, as GPT-NeoX refuses it" in \
        problems((TINY, MAMBA), pipe_parallel_size=0, zero_optimization={"stage": 3})


def test_attention_rules_still_hold_for_the_attention_layers_of_a_hybrid():
    msg = problems((TINY, MAMBA), hidden_size=130)
    assert "hidden_size(130) % num_attention_heads(4) = 2; it must be 0." in msg


def test_a_pipeline_partition_that_matches_no_block_is_named_before_deepspeed_fails():
    """GPT-NeoX's default type:transformer|mlp finds no Mamba block: DeepSpeed would raise in
    every worker; here deepy refuses with what to use. A hybrid balances its attention layers
    by it (docs/train.md)."""
    assert ("pipe_partition_method 'type:transformer|mlp' matches none of this model's blocks "
            "(MambaLayerPipe), so the pipeline stages cannot be balanced by it: use type:mamba "
            "or parameters.") in problems(
        (TINY,), attention_config=[[["mamba"], 2]], num_layers=2)
    assert "use type:transformer or parameters" in problems(pipe_partition_method="type:transfomer")
    NeoXArgs.from_ymls([TINY, MAMBA])  # the hybrid: its attention layer matches
    NeoXArgs.from_ymls([TINY], {"attention_config": [[["mamba"], 2]], "num_layers": 2,
                                "pipe_partition_method": "type:mamba"})
    NeoXArgs.from_ymls([TINY], {"attention_config": [[["mamba"], 2]], "num_layers": 2,
                                "pipe_parallel_size": 0})  # no pipeline: nothing to balance


def test_the_block_class_names_the_check_matches_are_the_model_s():
    from megatron.model.gpt import TransformerLayerPipe
    from megatron.model.mamba import MambaLayerPipe
    from megatron.neox_arguments.validate import BLOCK_CLASSES

    assert BLOCK_CLASSES == {"transformer": TransformerLayerPipe.__name__,
                             "mamba": MambaLayerPipe.__name__}
