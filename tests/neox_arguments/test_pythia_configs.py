"""The shipped Pythia configs (configs/pythia) describe EleutherAI's released Pythia models:
the shapes of each model's published Hugging Face config.json, the padded vocabulary of its
20B tokenizer (50277 ids) at the tensor-parallel degree it was trained with, and the parameter
count Pythia's README gives, counted here and on Hugging Face's GPTNeoXForCausalLM built on the
meta device. The converter's architecture check accepts each as the same model once the GELU
is the exact one Hugging Face declares, and names the difference otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from neox_args_helpers import stack

from megatron.neox_arguments import NeoXArgs
from megatron.neox_arguments.derived import padded_vocab_size

PYTHIA_TOKENIZER_IDS = 50277
# config.json of EleutherAI/pythia-<size>: hidden_size, num_hidden_layers, num_attention_heads,
# intermediate_size, vocab_size; total parameters from Pythia's README
PUBLISHED = {
    "70M": (512, 6, 8, 2048, 50304, 70_426_624),
    "160M": (768, 12, 12, 3072, 50304, 162_322_944),
    "410M": (1024, 24, 16, 4096, 50304, 405_334_016),
    "1B": (2048, 16, 8, 8192, 50304, 1_011_781_632),
    "1-4B": (2048, 24, 16, 8192, 50304, 1_414_647_808),
    "2-8B": (2560, 32, 32, 10240, 50304, 2_775_208_960),
    "6-9B": (4096, 32, 32, 16384, 50432, 6_857_302_016),
    "12B": (5120, 36, 40, 20480, 50688, 11_846_072_320),
}
# what every Pythia config.json shares
COMMON = dict(model_type="gpt_neox", rotary_pct=0.25, rotary_emb_base=10000,
              max_position_embeddings=2048, layer_norm_eps=1e-5, use_parallel_residual=True,
              hidden_act="gelu", tie_word_embeddings=False)


def hf_config(size: str):
    from transformers import GPTNeoXConfig

    hidden, layers, heads, width, vocab, _ = PUBLISHED[size]
    return GPTNeoXConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=width, vocab_size=vocab, **COMMON)


def ours(size: str, *overrides: str):
    from megatron.model.config import model_config_from_args

    args = NeoXArgs.from_ymls(stack(f"configs/pythia/{size}.yml"), list(overrides))
    vocab = padded_vocab_size(PYTHIA_TOKENIZER_IDS, args.model.make_vocab_size_divisible_by,
                              args.parallelism.model_parallel_size)
    return model_config_from_args(args, vocab)


@pytest.mark.parametrize("size", PUBLISHED)
def test_config_is_the_released_model(size):
    import torch
    from transformers import GPTNeoXForCausalLM

    from megatron.training.flops import count_parameters

    hidden, layers, heads, width, vocab, params = PUBLISHED[size]
    c = ours(size)
    assert (c.hidden_size, c.num_layers, c.num_attention_heads, c.intermediate_size,
            c.padded_vocab_size) == (hidden, layers, heads, width, vocab)
    assert (c.rotary_pct, c.rotary_emb_base, c.max_position_embeddings, c.norm_epsilon) == (
        0.25, 10000, 2048, 1e-5)
    assert c.gpt_j_residual and not c.tied_embeddings and c.norm == "layernorm"
    assert count_parameters(c) == params
    with torch.device("meta"):
        hf = GPTNeoXForCausalLM(hf_config(size))
    assert sum(p.numel() for p in hf.parameters()) == params


@pytest.mark.parametrize("size", ["70M", "6-9B"])
def test_the_converter_takes_the_released_model_with_the_exact_gelu(size):
    from megatron.checkpointing.hf_import import check_same_model
    from megatron.model.hf_mapping import hf_model_config

    name, theirs = hf_model_config(hf_config(size))
    where = Path("/models") / f"pythia-{size}"
    assert name == "neox"
    check_same_model(ours(size, "bias_gelu_fusion=false"), theirs, PYTHIA_TOKENIZER_IDS, where)
    with pytest.raises(ValueError) as err:  # as shipped: GPT-NeoX's tanh GELU (bias_gelu_fusion)
        check_same_model(ours(size), theirs, PYTHIA_TOKENIZER_IDS, where)
    assert str(err.value) == (
        f"the config does not describe the Hugging Face model in {where}: GELU approximation "
        f"(bias_gelu_fusion): 'tanh' in the config vs 'none' in {where}/config.json. Use a config "
        "with the model's architecture and tokenizer")


def test_attention_kinds_that_compute_the_same_are_the_same_architecture():
    """flash and global are one attention (flash-attn or SDPA computing it); flash with a
    window W sees W + 1 keys, as local with W + 1 does. A window is a difference."""
    import dataclasses

    from megatron.checkpointing.model_shape import architecture_mismatches

    flash = ours("70M")
    assert flash.attention_types == ("flash",) * 6
    same = dataclasses.replace(flash, attention_types=("global",) * 6)
    assert architecture_mismatches(flash, same) == []
    window = dataclasses.replace(flash, sliding_window_width=255)
    local = dataclasses.replace(flash, attention_types=("local",) * 6, sliding_window_width=256)
    assert architecture_mismatches(window, local) == []
    assert architecture_mismatches(window, flash) == [
        "attention (attention_config, sliding_window_width): 6 x 256 keys in this run's config "
        "vs 6 x all earlier keys in the checkpoint's"]
