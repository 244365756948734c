"""Parameter count against the built model; FLOPs per token and MFU against a hand count."""

import pytest

from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel
from megatron.training.flops import (count_parameters, flops_per_token, mfu_percent,
                                     model_tflops_per_device)

BASE = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_kv_heads=4,
            intermediate_size=128, seq_length=16, max_position_embeddings=16, padded_vocab_size=64)


@pytest.mark.parametrize("overrides", [
    {},
    dict(tied_embeddings=True, pos_emb="learned"),
    dict(num_kv_heads=2, activation="swiglu", norm="rmsnorm", use_bias_in_attn_linear=False,
         use_bias_in_mlp=False, use_bias_in_norms=False),
    dict(norm="scalenorm", activation="geglu"),
], ids=["neox", "tied-learned", "llama", "scalenorm-geglu"])
def test_count_matches_the_built_model(overrides):
    config = ModelConfig(**{**BASE, **overrides})
    assert count_parameters(config) == sum(p.numel() for p in GPTModel(config).parameters())


def test_flops_per_token_by_hand():
    config = ModelConfig(**BASE)
    # per layer: qkv 32*96 + dense 32*32 + mlp 32*128*2 = 3072 + 1024 + 8192 = 12288 weights
    forward = 2 * 2 * 12288 + 2 * 64 * 32 + 2 * 4 * 16 * 32
    assert flops_per_token(config) == 3 * forward
    # GPT-3 125M shape: ~6 * N FLOPs per token dominates
    gpt3 = ModelConfig(num_layers=12, hidden_size=768, num_attention_heads=12, num_kv_heads=12,
                       intermediate_size=3072, seq_length=2048, max_position_embeddings=2048,
                       padded_vocab_size=50304)
    n = count_parameters(gpt3)
    assert 1.2e8 < n < 1.7e8
    assert 6 * n * 0.9 < flops_per_token(gpt3) < 6 * n * 1.5


def test_mfu_by_hand():
    config = ModelConfig(**BASE)
    per_token = flops_per_token(config)  # 3 * 57344 = 172032, as counted above
    # 1.5M tokens/s over 4 devices: 172032 * 1.5e6 / 4 = 6.4512e10 FLOP/s = 0.064512 TFLOP/s each
    tflops = model_tflops_per_device(per_token, 1.5e6, 4)
    assert tflops == pytest.approx(0.064512, rel=1e-12)
    # against a 0.2 TFLOP/s peak: 32.256 percent (GPT-NeoX's unit)
    assert mfu_percent(tflops, 0.2) == pytest.approx(32.256, rel=1e-12)
    # one H100 (989 TFLOP/s bf16) running the GPT-3 125M shape at 400k tokens/s
    gpt3 = ModelConfig(num_layers=12, hidden_size=768, num_attention_heads=12, num_kv_heads=12,
                       intermediate_size=3072, seq_length=2048, max_position_embeddings=2048,
                       padded_vocab_size=50304)
    forward = 2 * 12 * 12 * 768**2 + 2 * 50304 * 768 + 12 * 4 * 2048 * 768
    assert mfu_percent(model_tflops_per_device(flops_per_token(gpt3), 4e5, 1), 989) == (
        pytest.approx(100 * 3 * forward * 4e5 / 1e12 / 989, rel=1e-12))
