"""Derived values: world and batch sizes, precision, schedule, MLP width, vocab padding."""

from __future__ import annotations

import pytest

from neox_args_helpers import make

from megatron.neox_arguments import ConfigError, padded_vocab_size
from megatron.neox_arguments.derived import (
    expand_attention_types, mlp_width, resolve_batch_sizes, save_iterations,
)


def test_micro_and_accumulation_give_train_batch():
    d = make(world_size=8, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2).derived
    assert (d.data_parallel_size, d.train_batch_size) == (8, 64)


def test_train_batch_and_micro_give_accumulation():
    d = make(world_size=4, train_batch_size=64, train_micro_batch_size_per_gpu=4).derived
    assert d.gradient_accumulation_steps == 4


def test_train_batch_and_accumulation_give_micro():
    d = make(world_size=4, train_batch_size=64, gradient_accumulation_steps=2,
             train_micro_batch_size_per_gpu=None).derived
    assert d.train_micro_batch_size_per_gpu == 8


def test_train_batch_alone_means_no_accumulation():
    d = make(world_size=2, train_batch_size=32, train_micro_batch_size_per_gpu=None).derived
    assert (d.train_micro_batch_size_per_gpu, d.gradient_accumulation_steps) == (16, 1)


def test_micro_alone_means_no_accumulation():
    d = make(world_size=3).derived
    assert (d.gradient_accumulation_steps, d.train_batch_size) == (1, 6)


def test_consistent_triple_is_accepted_and_inconsistent_is_refused():
    assert make(world_size=2, train_batch_size=8, gradient_accumulation_steps=2).derived.train_batch_size == 8
    with pytest.raises(ConfigError) as e:
        make(world_size=2, train_batch_size=10, gradient_accumulation_steps=2)
    assert str(e.value) == (
        "train_micro_batch_size_per_gpu(2) * gradient_accumulation_steps(2) * "
        "data_parallel_size(2) = 8 != train_batch_size(10); give any two of the three and the "
        "third is derived."
    )


def test_indivisible_pair_is_refused():
    with pytest.raises(ConfigError, match=r"train_batch_size\(10\) is not divisible by "
                       r"train_micro_batch_size_per_gpu\(2\) \* data_parallel_size\(3\) = 6"):
        make(world_size=3, train_batch_size=10)
    with pytest.raises(ConfigError, match="No batch size is set"):
        resolve_batch_sizes(1, None, None, 4)


def test_world_size_comes_from_nodes_and_gpus_or_the_launcher():
    assert make().derived.world_size == 1  # num_nodes -1 and num_gpus null count as 1
    assert make(num_nodes=2, num_gpus=4).derived.world_size == 8
    args = make(num_gpus=2, model_parallel_size=2)
    assert (args.derived.world_size, args.derived.data_parallel_size) == (2, 1)
    wider = args.with_world_size(8)
    assert (wider.derived.world_size, wider.derived.data_parallel_size) == (8, 4)
    assert wider.derived.train_batch_size == 8 and wider == args
    with pytest.raises(ConfigError, match=r"world_size\(0\) must be an integer of at least 1"):
        args.with_world_size(0)
    # num_gpus unset and one rank too few for a replica: one replica per node is assumed
    assert make(model_parallel_size=2, pipe_parallel_size=2).derived.world_size == 4
    assert make(model_parallel_size=2, num_nodes=3).derived.world_size == 6


def test_schedule_and_shapes():
    d = make(train_iters=1000, warmup=0.01).derived
    assert (d.lr_decay_iters, d.warmup_iters) == (1000, 10)
    d = make(train_iters=1000, lr_decay_iters=500, warmup=0.1).derived
    assert (d.lr_decay_iters, d.warmup_iters) == (500, 50)
    d = make(num_kv_heads=2).derived
    assert (d.num_kv_heads, d.head_dim, d.pipeline_stages, d.is_pipe_parallel) == (2, 16, 1, False)
    assert make().derived.num_kv_heads == 4


def test_text_gen_type_defaults_like_gpt_neox():
    assert make().derived.text_gen_type == "unconditional"
    assert make(sample_input_file="prompts.txt").derived.text_gen_type == "input-file"
    assert make(text_gen_type="interactive").derived.text_gen_type == "interactive"


def test_precision_resolution():
    assert make().derived.precision == "fp32"
    assert make(fp16={"enabled": True}).derived.precision == "fp16"
    assert make(bf16={"enabled": True}).derived.precision == "bf16"
    assert make(fp16={"enabled": True, "type": "bfloat16"}).derived.precision == "bf16"
    assert make(fp16={"enabled": False}).derived.precision == "fp32"
    assert make(precision="fp16").derived.precision == "fp16"


def test_mlp_width_follows_gpt_neox():
    assert mlp_width(768, None, "gelu", 1) == 3072
    assert mlp_width(768, 2000, "relu", 64) == 2048
    assert mlp_width(4096, 32768, "swiglu", 256) == 11008  # GPT-NeoX's Llama-2-7B config
    assert mlp_width(128, None, "geglu", 1) == 170  # int(512 * 2 / 3) // 2
    assert make(activation="reglu", mlp_multiple_of=8).derived.intermediate_size == 88


def test_attention_expansion():
    assert expand_attention_types(None, 3) == ("global",) * 3
    assert expand_attention_types([[["global", "local"], 2]], 4) == ("global", "local") * 2
    assert expand_attention_types([[["global"], 1], [["local"], 2]], 3) == ("global", "local", "local")
    assert expand_attention_types(["global", "flash"], 2) == ("global", "flash")
    with pytest.raises(ConfigError, match=r"num_layers\(3\) is not a multiple of its length\(2\)"):
        expand_attention_types([[["global", "local"], "all"]], 3)


def test_save_iterations():
    assert save_iterations(100, 25, "linear", None) == (25, 50, 75)
    # GPT-NeoX's log scale saves at int(factor**k) for k >= 0, so iteration 1 (2**0) as well
    assert save_iterations(100, 2, "log", [0, 5]) == (0, 1, 2, 4, 5, 8, 16, 32, 64)
    assert save_iterations(100, None, "linear", None) == ()


def test_padded_vocab_size():
    assert padded_vocab_size(50277, 128, 1) == 50304
    assert padded_vocab_size(50277, 128, 2) == 50432
    assert padded_vocab_size(256, 128, 1) == 256
