"""The LLaMA-family configs (configs/llama, llama2, mistral, llemma) describe the published
models: their shapes and parameter counts, counted and built on the meta device (nothing is
allocated), and they merge with the LLaMA training settings as GPT-NeoX merges files."""

from __future__ import annotations

import pytest

from neox_args_helpers import LLAMA_TRAINING, MODEL_ONLY, REPO, stack

from megatron.neox_arguments import NeoXArgs
from megatron.neox_arguments.derived import padded_vocab_size
from megatron.neox_arguments.load import read_yml

# layers, hidden, heads, kv heads, MLP width, vocabulary, norm eps, rotary base, sequence,
# parameters (as the released weights count them)
PUBLISHED = {
    "llama/7B": (32, 4096, 32, 32, 11008, 32000, 1e-6, 10000, 2048, 6_738_415_616),
    "llama/13B": (40, 5120, 40, 40, 13824, 32000, 1e-6, 10000, 2048, 13_015_864_320),
    "llama/30B": (60, 6656, 52, 52, 17920, 32000, 1e-6, 10000, 2048, 32_528_943_616),
    "llama/65B": (80, 8192, 64, 64, 22016, 32000, 1e-6, 10000, 2048, 65_285_660_672),
    "llama2/7B": (32, 4096, 32, 32, 11008, 32000, 1e-5, 10000, 4096, 6_738_415_616),
    "llama2/13B": (40, 5120, 40, 40, 13824, 32000, 1e-5, 10000, 4096, 13_015_864_320),
    "llama2/70B": (80, 8192, 64, 8, 28672, 32000, 1e-5, 10000, 4096, 68_976_648_192),
    "llama2/codellama_7B": (32, 4096, 32, 32, 11008, 32016, 1e-5, 1e6, 16384, 6_738_546_688),
    "llama2/codellama_34B": (48, 8192, 64, 8, 22016, 32000, 1e-5, 1e6, 16384, 33_743_970_304),
    "mistral/7B": (32, 4096, 32, 8, 14336, 32000, 1e-5, 10000, 8192, 7_241_732_096),
    "llemma/7B": (32, 4096, 32, 32, 11008, 32016, 1e-5, 10000, 4096, 6_738_546_688),
    "llemma/34B": (48, 8192, 64, 8, 22016, 32000, 1e-5, 1e6, 4096, 33_743_970_304),
}


def model_config(name: str):
    from megatron.model.config import model_config_from_args

    args = NeoXArgs.from_ymls(stack(f"configs/{name}.yml"))
    vocab = PUBLISHED[name][5]
    return model_config_from_args(args, padded_vocab_size(
        vocab, args.model.make_vocab_size_divisible_by, args.parallelism.model_parallel_size))


@pytest.mark.parametrize("name", PUBLISHED)
def test_config_is_the_published_model(name):
    from megatron.training.flops import count_parameters

    c = model_config(name)
    layers, hidden, heads, kv, width, vocab, eps, base, seq, params = PUBLISHED[name]
    assert (c.num_layers, c.hidden_size, c.num_attention_heads, c.num_kv_heads) == (
        layers, hidden, heads, kv)
    assert (c.intermediate_size, c.padded_vocab_size) == (width, vocab)
    assert (c.norm_epsilon, c.rotary_emb_base, c.seq_length) == (eps, base, seq)
    assert (c.norm, c.activation, c.pos_emb, c.rotary_pct) == ("rmsnorm", "swiglu", "rotary", 1)
    assert not (c.use_bias_in_norms or c.use_bias_in_attn_linear or c.use_bias_in_mlp)
    assert not (c.tied_embeddings or c.gpt_j_residual)
    assert count_parameters(c) == params


@pytest.mark.parametrize("name", ["llama/7B", "llama2/70B", "mistral/7B"])
def test_built_model_has_the_published_parameter_count(name):
    import torch

    from megatron.model.gpt import GPTModel

    with torch.device("meta"):
        model = GPTModel(model_config(name))
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name][-1]


def test_mistral_attends_to_a_sliding_window_on_every_layer():
    c = model_config("mistral/7B")
    assert c.sliding_window_width == 4096 and c.attention_types == ("flash",) * 32
    assert c.max_position_embeddings == 131072


def test_llemma_accumulates_bf16_gradients_in_fp32():
    from megatron.neox_arguments import deepspeed_config

    for name in ("7B", "34B"):  # both trained on 256 GPUs, 1024 sequences per step
        args = NeoXArgs.from_ymls(stack(f"configs/llemma/{name}.yml")).with_world_size(256)
        ds = deepspeed_config(args)
        assert args.derived.precision == "bf16" and args.derived.train_batch_size == 1024
        assert ds["data_types"] == {"grad_accum_dtype": "fp32"}
        assert ds["zero_optimization"]["stage"] == 1 and ds["communication_data_type"] == "fp32"
    args = NeoXArgs.from_ymls(stack("configs/llemma/7B.yml"))
    assert args.derived.warmup_iters == 500 and args.min_lr == pytest.approx(0.033 * args.lr)


MODEL_FILES = [f"configs/{n}.yml" for n in PUBLISHED if f"configs/{n}.yml".startswith(MODEL_ONLY)]


@pytest.mark.parametrize("name", MODEL_FILES)
def test_model_file_and_training_settings_share_no_key(name):
    """GPT-NeoX refuses a key that two of the files it merges both give."""
    def keys(path):
        return {k.replace("-", "_") for k in read_yml(REPO / path)}

    assert not keys(name) & keys(LLAMA_TRAINING)
