"""The sinusoidal position table: GPT-NeoX's layout, sines first and then cosines."""

from __future__ import annotations

import math

import pytest
import torch

from megatron.model.config import ModelConfig
from megatron.model.embedding import Embedding
from megatron.model.positional import sinusoidal_table


def neox_sinusoidal(positions: int, dim: int) -> list[list[float]]:
    """GPT-NeoX's SinusoidalPositionalEmbedding written out: frequencies 10000 ** (-i / dim) for
    even i < dim, the sine of every position times each frequency, then every cosine."""
    freqs = [10000 ** (-i / dim) for i in range(0, dim, 2)]
    return [[math.sin(p * f) for f in freqs] + [math.cos(p * f) for f in freqs]
            for p in range(positions)]


@pytest.mark.parametrize("dim", [2, 8, 64, 100])
def test_table_is_gpt_neox_sines_then_cosines(dim):
    table = sinusoidal_table(48, dim)
    assert table.shape == (48, dim) and table.dtype == torch.float32
    expected = torch.tensor(neox_sinusoidal(48, dim), dtype=torch.float64)
    torch.testing.assert_close(table.double(), expected, rtol=0, atol=2e-5)
    # position 0: every sine 0, every cosine 1
    assert table[0, : dim // 2].eq(0).all() and table[0, dim // 2:].eq(1).all()


@pytest.mark.parametrize("dim", [7, 33])
def test_odd_width_is_gpt_neox_table_without_its_last_cosine(dim):
    # GPT-NeoX's table has dim + 1 columns here (its addition to the hidden state fails)
    wide = torch.tensor(neox_sinusoidal(20, dim), dtype=torch.float64)
    assert wide.shape == (20, dim + 1)
    torch.testing.assert_close(sinusoidal_table(20, dim).double(), wide[:, :dim], rtol=0,
                               atol=2e-5)


def test_embedding_adds_the_table_at_the_given_positions():
    config = ModelConfig(num_layers=1, hidden_size=16, num_attention_heads=2, num_kv_heads=2,
                         intermediate_size=64, seq_length=8, max_position_embeddings=32,
                         padded_vocab_size=32, pos_emb="sinusoidal")
    embedding = Embedding(config)
    tokens = torch.tensor([[3, 3, 3]])  # [b, s]
    positions = torch.tensor([[0, 5, 9]])
    out = embedding(tokens, positions)  # [b, s, h]
    word = embedding.word_embeddings.weight[3]
    expected = torch.tensor(neox_sinusoidal(10, 16))[[0, 5, 9]] + word
    torch.testing.assert_close(out[0].detach(), expected.float(), rtol=0, atol=1e-5)
