"""Initialisation methods: the scale of each matches GPT-NeoX's init_functions."""

from __future__ import annotations

import math

import pytest
import torch

from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel
from megatron.model.init import init_methods, layer_generator

LAYERS = 12


def config(**overrides) -> ModelConfig:
    base = dict(num_layers=LAYERS, hidden_size=32, num_attention_heads=2, num_kv_heads=2,
                intermediate_size=64, seq_length=8, max_position_embeddings=16,
                padded_vocab_size=64)
    base.update(overrides)
    return ModelConfig(**base)


def singular_values(weight: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(weight.detach().double())


# GPT-NeoX's orthogonal_init_method multiplies by sqrt(2 / n_layers): scaled_orthogonal passes
# num_layers; orthogonal means the function's default n_layers = 1
GAINS = {"orthogonal": math.sqrt(2.0), "scaled_orthogonal": math.sqrt(2.0 / LAYERS)}


@pytest.mark.parametrize("name", sorted(GAINS))
@pytest.mark.parametrize("shape", [(48, 48), (96, 32), (32, 128)])
def test_orthogonal_singular_values_equal_gpt_neox_gain(name, shape):
    init, output_init = init_methods(config(init_method=name, output_layer_init_method=name))
    for fn in (init, output_init):
        weight = torch.empty(shape)
        fn(weight, layer_generator(1234, 3))
        values = singular_values(weight)
        assert len(values) == min(shape)
        torch.testing.assert_close(values, torch.full_like(values, GAINS[name]), rtol=1e-5,
                                   atol=0)


def test_model_layers_take_the_orthogonal_gains():
    model = GPTModel(config(init_method="orthogonal", output_layer_init_method="scaled_orthogonal"))
    block = model.layers[1]
    for weight, gain in ((block.attention.query_key_value.weight, GAINS["orthogonal"]),
                         (block.attention.dense.weight, GAINS["scaled_orthogonal"]),
                         (block.mlp.dense_4h_to_h.weight, GAINS["scaled_orthogonal"])):
        values = singular_values(weight)
        torch.testing.assert_close(values, torch.full_like(values, gain), rtol=1e-5, atol=0)
