"""Tensor-parallel splits checked at config time, before any process exists (A15)."""

import pytest

from megatron.neox_arguments import ConfigError, NeoXArgs


def load(*overrides):
    return NeoXArgs.from_ymls(["configs/tiny.yml"], list(overrides))


def test_mlp_width_must_split_over_tensor_parallel_ranks():
    with pytest.raises(ConfigError, match=r"MLP width\(130.*% model_parallel_size\(4\) = 2"):
        load("model_parallel_size=4", "num_gpus=4", "intermediate_size=130")


def test_sequence_parallel_needs_seq_length_divisible_by_tp():
    with pytest.raises(ConfigError, match=r"seq_length\(126\) % 4 = 2"):
        load("model_parallel_size=4", "num_gpus=4", "sequence_parallel=true", "seq_length=126")


def test_heads_and_kv_heads_must_split():
    with pytest.raises(ConfigError, match=r"num_attention_heads\(4\) % model_parallel_size\(8\)"):
        load("model_parallel_size=8", "num_gpus=8")
    with pytest.raises(ConfigError, match=r"num_kv_heads\(2\) % model_parallel_size\(4\)"):
        load("model_parallel_size=4", "num_gpus=4", "num_kv_heads=2")


def test_more_stages_than_layers():
    with pytest.raises(ConfigError, match=r"pipe_parallel_size\(8\) > num_layers\(4\)"):
        load("pipe_parallel_size=8", "num_gpus=8")
