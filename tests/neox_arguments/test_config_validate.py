"""A15: each consistency rule fails with a message naming the keys, the values and the rule."""

from __future__ import annotations

import importlib.util

import pytest

from neox_args_helpers import make

from megatron.neox_arguments import ConfigError
from megatron.neox_arguments.registries import REGISTRIES


def error(world_size=None, **values) -> str:
    with pytest.raises(ConfigError) as e:
        make(world_size=world_size, **values)
    return str(e.value)


CASES = [
    # (values, world_size, expected fragment)
    ({"hidden_size": 66}, None, "hidden_size(66) % num_attention_heads(4) = 2; it must be 0"),
    ({"model_parallel_size": 3, "num_attention_heads": 4, "hidden_size": 48}, 3,
     "num_attention_heads(4) % model_parallel_size(3) = 1"),
    ({"num_kv_heads": 3}, None, "num_kv_heads(3) must divide num_attention_heads(4)"),
    ({"num_kv_heads": 1, "model_parallel_size": 2}, 2,
     "num_kv_heads(1) % model_parallel_size(2) = 1"),
    ({"model_parallel_size": 2, "pipe_parallel_size": 2}, 6,
     "world_size(6) is not divisible by model_parallel_size(2) * pipe_parallel_size(2) = 4"),
    ({"model_parallel_size": 2, "num_gpus": 3}, None,
     "world_size(num_nodes(-1) * num_gpus(3) = 3) is not divisible by model_parallel_size(2)"),
    ({"pipe_parallel_size": 3}, 3, "pipe_parallel_size(3) > num_layers(2)"),
    ({"seq_length": 64}, None, "seq_length(64) > max_position_embeddings(32)"),
    ({"min_lr": 0.01}, None, "min_lr(0.01) > optimizer.params.lr(0.001)"),
    ({"warmup": 1.5}, None, "warmup(1.5) is a fraction of lr_decay_iters and must be in [0, 1]"),
    ({"train_iters": 0}, None, "train_iters(0) must be at least 1"),
    ({"attention_config": [[["global"], 3]]}, None,
     "attention_config expands to 3 layer types but num_layers is 2"),
    ({"attention_config": [["global", 2]]}, None, "attention_config entry 0 is"),
    ({"attention_config": [[["local"], 2]]}, None, "sliding_window_width must be set"),
    ({"attention_config": [[["sparse_fixed"], 2]]}, None,
     "attention_config 'sparse_fixed' is a GPT-NeoX choice this project does not support yet"),
    ({"zero_optimization": {"stage": 4}}, None, "zero_optimization.stage(4) must be 0, 1, 2 or 3"),
    ({"zero_optimization": {"stage": 2}, "pipe_parallel_size": 2}, 2,
     "zero_optimization.stage(2) with pipe_parallel_size(2)"),
    # one stage still runs DeepSpeed's pipeline engine, which asserts on ZeRO 2 and 3
    ({"zero_optimization": {"stage": 3}, "pipe_parallel_size": 1}, None,
     "zero_optimization.stage(3) with pipe_parallel_size(1): DeepSpeed's pipeline engine"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, None,
     "fp16.enabled and bf16.enabled are both true"),
    ({"precision": "fp32", "fp16": {"enabled": True}}, None,
     "precision is 'fp32' but the fp16 section is enabled"),
    ({"precision": "bf16", "bf16": {"enabled": False}}, None,
     "precision is 'bf16' but bf16.enabled is false"),
    ({"fp16": {"enabled": True, "loss_scale_windw": 100}}, None,
     "fp16.loss_scale_windw is not a DeepSpeed fp16 option"),
    ({"optimizer": {"type": "Lamb", "params": {"lr": 0.01}}}, None,
     "optimizer.type 'Lamb' is a GPT-NeoX choice this project does not support yet; choose one of: Adam, AdamW, SGD"),
    ({"optimizer": {"type": "Adamm", "params": {"lr": 0.01}}}, None,
     "optimizer.type 'Adamm' is not a valid choice; choose one of: Adam, AdamW, SGD"),
    ({"optimizer": {"type": "Adam", "params": {"lr": -1}}}, None,
     "optimizer.params.lr(-1) must be a number greater than 0"),
    ({"optimizer": {"type": "Adam", "params": {"lr": 0.1, "betas": [0.9]}}}, None,
     "optimizer.params.betas([0.9]) must be two numbers in [0, 1)"),
    ({"optimizer": {"lr": 0.1}}, None, "optimizer must look like {type: Adam, params:"),
    # a misspelt or foreign key would otherwise train with the default
    ({"optimizer": {"type": "Adam", "params": {"lr": 0.1, "beta": [0.9, 0.95]}}}, None,
     "optimizer.params has beta, which optimizer type Adam does not take; valid: lr, betas, "
     "eps, adam_w_mode, bias_correction, amsgrad, set_grad_none."),
    ({"optimizer": {"type": "Adam", "params": {"lr": 0.1, "weight_decay": 0.5}}}, None,
     "optimizer.params.weight_decay(0.5) would not be used: the top-level weight_decay(0.1) "
     "decays the matrices. Move the value to weight_decay"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 0.1, "momentum": 0.9}}}, None,
     "optimizer.params has momentum, which optimizer type AdamW does not take"),
    ({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "eps": 1e-8}}}, None,
     "optimizer.params has eps, which optimizer type SGD does not take; valid: lr, momentum, "
     "dampening, nesterov."),
    ({"optimizer": {"type": "Adam", "params": {"lr": 0.1, "amsgrad": True}}}, None,
     "optimizer.params.amsgrad(true) is not supported"),
    ({"optimizer": {"type": "Adam", "params": {"lr": 0.1, "bias_correction": False}}}, None,
     "optimizer.params.bias_correction(false) is not supported"),
    ({"optimizer": {"type": "Adam", "params": {"lr": 0.1, "adam_w_mode": "no"}}}, None,
     "optimizer.params.adam_w_mode('no') must be true or false."),
    ({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "nesterov": True}}}, None,
     "optimizer.params.nesterov(true) needs momentum greater than 0 and dampening 0"),
    ({"pos_emb": "rpe"}, None, "pos_emb 'rpe' is a GPT-NeoX choice this project does not support yet"),
    ({"norm": "batchnorm"}, None,
     "norm 'batchnorm' is not a valid choice; choose one of: layernorm, rmsnorm, scalenorm"),
    ({"activation": "swish"}, None, "activation 'swish' is a GPT-NeoX choice"),
    ({"init_method": "he"}, None, "init_method 'he' is not a valid choice; choose one of: normal,"),
    ({"lr_decay_style": "exp"}, None, "lr_decay_style 'exp' is not a valid choice; choose one of: "
     "constant, linear, cosine, exponential"),
    ({"lr_decay_fraction": 1.5}, None, "lr_decay_fraction(1.5) is a fraction of train_iters and "
     "must be in (0, 1]"),
    ({"use_checkpoint_lr_scheduler": True, "override_lr_scheduler": True}, None,
     "use_checkpoint_lr_scheduler and override_lr_scheduler are both true; choose one"),
    ({"tokenizer_type": "BertTokenizer"}, None, "tokenizer_type 'BertTokenizer' is not a valid choice"),
    ({"text_gen_type": "precompute"}, None, "text_gen_type 'precompute' is a GPT-NeoX choice"),
    ({"text_gen_type": "input-file"}, None, "text_gen_type is input-file, so sample_input_file must be set"),
    ({"launcher": "mpirun"}, None, "launcher 'mpirun' is not a valid choice; choose one of: pdsh"),
    ({"peak_theoretical_tflops": 0}, None, "peak_theoretical_tflops(0.0) must be greater than 0"),
    ({"wandb_host": "api.wandb.ai"}, None,
     "wandb_host('api.wandb.ai') must be a URL such as https://api.wandb.ai"),
    ({"pipe_partition_method": "balanced"}, None,
     "pipe_partition_method 'balanced' is not valid; use parameters, uniform or type:<regex>"),
    ({"pipe_partition_method": "type:("}, None, "invalid regex after 'type:'"),
    ({"output_layer_parallelism": "row"}, None, "output_layer_parallelism 'row' is a GPT-NeoX choice"),
    ({"distributed_backend": "mpi"}, None, "distributed_backend 'mpi' is not a valid choice"),
    ({"pos_emb": "rotary", "rotary_pct": 0.1}, None, "rotary_pct(0.1) * head dim(16) = 1 rotary dims"),
    ({"hidden_dropout": 1.0}, None, "hidden_dropout(1.0) must be in [0, 1)"),
    ({"save": "ckpt"}, None, "save is set (ckpt) but neither checkpoint_factor nor extra_save_iters is"),
    ({"checkpoint_factor": 1, "checkpoint_scale": "log"}, None,
     "checkpoint_factor(1) with checkpoint_scale log must be greater than 1"),
    ({"checkpoint_factor": 2.5}, None,
     "checkpoint_factor(2.5) with checkpoint_scale linear must be a whole number"),
    ({"split": "90,5,5,1"}, None, "split('90,5,5,1') must be up to three non-negative numbers"),
    ({"train_data_paths": ["a"]}, None,
     "train_data_paths, valid_data_paths and test_data_paths must be given together"),
    ({"train_data_paths": ["a"], "valid_data_paths": ["b"], "test_data_paths": ["c"],
      "train_data_weights": [1.0, 2.0]}, None,
     "train_data_weights has 2 entries but train_data_paths has 1; give one weight per path"),
    ({"num_nodes": 2, "node_rank": 2}, None, "node_rank(2) must be in [0, num_nodes(2))"),
    ({"num_nodes": 2, "no_ssh": True}, None, "node_rank must be set when num_nodes > 1"),
    ({"master_port": 70000}, None, "master_port(70000) must be in [1, 65535]"),
    ({"no_ssh": True, "node_rank": 1}, None,
     "no_ssh and node_rank set without a hostfile: launching one node of a multi-node job needs "
     "the hostfile listing every node; add hostfile=<path>"),
    ({"node_rank": 0}, None, "or remove node_rank to run on this machine only"),
    ({"deepspeed_mpi": True, "launcher": "openmpi"}, None,
     "deepspeed_mpi reads ranks from the variables mpirun sets, but launcher is 'openmpi' and "
     "hostfile is not set"),
    ({"deepspeed_mpi": True, "hostfile": "h"}, None,
     "launcher is 'pdsh' and hostfile is h: set launcher to one of openmpi, mpich, impi, mvapich"),
    ({"deepspeed_slurm": True, "hostfile": "h"}, None,
     "deepspeed_slurm reads ranks from the variables srun sets, but launcher is 'pdsh': set "
     "launcher: slurm, or remove deepspeed_slurm"),
    ({"global_num_gpus": 2}, None, "global_num_gpus(2) != world_size(num_nodes(-1) * "
     "num_gpus(None) = 1): the world size is derived from num_nodes and num_gpus"),
    ({"global_num_gpus": 2, "hostfile": "h"}, 4, "global_num_gpus(2) != world_size(4)"),
    ({"data_types": {"grad_accum_dtype": "fp32"}, "precision": "bf16"}, None,
     "data_types.grad_accum_dtype(fp32) differs from the precision (bf16); DeepSpeed accumulates "
     "gradients in another dtype than the model's only with ZeRO stage 1 or 2, and "
     "zero_optimization.stage is 0"),
    ({"data_types": {"grad_accum_dtype": "fp32"}, "precision": "bf16",
      "zero_optimization": {"stage": 3}}, None, "and zero_optimization.stage is 3"),
    ({"data_types": {"grad_accum_dtype": "int8"}}, None,
     "data_types.grad_accum_dtype('int8') must be one of fp32, float32, fp16"),
    ({"data_types": {"param_dtype": "bf16"}}, None,
     "data_types.param_dtype is not supported; only grad_accum_dtype is"),
    ({"deepspeed_extra_args": {"data_types": {"grad_accum_dtype": "fp32"}}}, None,
     "deepspeed_extra_args.data_types would replace the value generated from data_types"),
    ({"deepspeed_slurm": True, "deepspeed_mpi": True}, None,
     "deepspeed_mpi and deepspeed_slurm are both true"),
    ({"deepspeed_slurm": True, "launcher": "slurm", "hostfile": "h", "no_ssh": True,
      "node_rank": 0}, None, "remove deepspeed_slurm or no_ssh"),
    ({"distributed_timeout_minutes": 0}, None, "distributed_timeout_minutes(0.0) must be greater than 0"),
    ({"signal_grace_seconds": -1}, None, "signal_grace_seconds(-1.0) must be 0 or more"),
    ({"export_env_vars": ["OK", "NOT-OK"]}, None, "export_env_vars has invalid variable names: 'NOT-OK'"),
    ({"top_p": 2.0}, None, "top_p(2.0) must be in [0, 1]"),
    ({"deepspeed_extra_args": {"optimizer": {"type": "Adam"}}}, None,
     "deepspeed_extra_args.optimizer would replace the value generated from optimizer"),
    ({"num_gpus": 0}, None, "num_gpus(0) must be at least 1"),
    ({"profile": True, "log_dir": "logs"}, None,  # GPT-NeoX's default window: 10 to 12
     "profile_step_start(10) and profile_step_stop(12) reach beyond train_iters(10): those steps "
     "would not all run; set profile_step_stop to at most train_iters."),
    ({"memory_profiling": True, "memory_profiling_path": "m", "profile_step_start": 4,
      "profile_step_stop": 4}, None, "profile_step_start(4) and profile_step_stop(4): "
     "profile_step_stop must be greater than profile_step_start"),
    ({"profile": True, "log_dir": "logs", "profile_step_start": -1}, None,
     "profile_step_start(-1) must be at least 0"),
    ({"profile": True, "profile_step_start": 2, "profile_step_stop": 4}, None,
     "profile is true but neither tensorboard_dir nor log_dir is set; set tensorboard_dir"),
    ({"memory_profiling": True, "profile_step_start": 2, "profile_step_stop": 4}, None,
     "memory_profiling is true but memory_profiling_path is not set"),
    ({"hang_timeout_minutes": -1}, None, "hang_timeout_minutes(-1.0) must be at least 0"),
]


@pytest.mark.parametrize("values,world_size,expected", CASES, ids=[c[2][:40] for c in CASES])
def test_rule(values, world_size, expected):
    assert expected in error(world_size=world_size, **values)


def test_required_keys_are_named():
    from megatron.neox_arguments import NeoXArgs

    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_dict({"num_layers": 2}, source="x")
    msg = str(e.value)
    assert msg.startswith("The config has 5 problems:")
    assert "hidden_size is required but not set" in msg and "train_iters is required" in msg


def test_all_problems_are_reported_together():
    msg = error(hidden_size=66, seq_length=64)
    assert msg.startswith("The config has 2 problems:")
    assert "hidden_size(66)" in msg and "seq_length(64)" in msg


def test_flash_without_flash_attn_is_accepted(monkeypatch):
    """torch SDPA computes flash's attention where flash-attn is missing (the model logs it)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a)
    )
    assert make(attention_config=[[["flash"], 2]]).derived.attention_types == ("flash", "flash")


def test_a_sliding_window_no_layer_uses_is_refused():
    assert "sliding_window_width(8) is set but no layer uses it: only 'flash' and 'local'" in \
        error(sliding_window_width=8)
    assert make(attention_config=[[["flash"], 2]], sliding_window_width=8).sliding_window_width == 8


def test_flash_is_accepted_when_flash_attn_is_importable(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a)
    )
    assert make(attention_config=[[["flash"], 2]]).derived.attention_types == ("flash", "flash")


def test_valid_neighbours_of_the_rules_pass():
    assert make(num_kv_heads=2, model_parallel_size=2, world_size=2).derived.num_kv_heads == 2
    assert make(zero_optimization={"stage": 1}, pipe_parallel_size=2, world_size=2).zero_stage == 1
    assert make(zero_optimization={"stage": 3}, pipe_parallel_size=0).zero_stage == 3
    assert make(attention_config=[[["global", "local"], "all"]], sliding_window_width=8
                ).derived.attention_types == ("global", "local")
    assert make(precision="bfloat16").derived.precision == "bf16"
    assert make(precision="fp16", fp16={"loss_scale": 0}).derived.precision == "fp16"
    assert make(pipe_partition_method="type:transformer|mlp").pipe_partition_method.startswith("type:")
    assert make(data_impl="infer").data_impl == "infer"
    assert make(global_num_gpus=1).launcher.global_num_gpus == 1
    assert make(global_num_gpus=4, num_gpus=4).derived.world_size == 4
    # with a hostfile the launcher counts the world, and checks global_num_gpus then
    assert make(global_num_gpus=16, hostfile="h").with_world_size(16).derived.world_size == 16
    assert make(deepspeed_slurm=True, launcher="slurm").launcher.deepspeed_slurm  # no hostfile yet
    bf16_fp32 = {"precision": "bf16", "data_types": {"grad_accum_dtype": "fp32"}}
    assert make(zero_optimization={"stage": 1}, **bf16_fp32).deepspeed.data_types == {
        "grad_accum_dtype": "fp32"}
    assert make(zero_optimization={"stage": 2}, pipe_parallel_size=0, **bf16_fp32)
    assert make(precision="bf16", data_types={"grad_accum_dtype": "bfloat16"})  # the same dtype
    # the profiled steps may end at train_iters; with profiling off the window is not checked
    assert make(profile=True, tensorboard_dir="tb", profile_step_start=0, profile_step_stop=10)
    assert make(profile_step_start=20, profile_step_stop=5).logging.profile_step_start == 20


def test_every_registry_rejects_an_unknown_name():
    for key, registry in REGISTRIES.items():
        with pytest.raises(ConfigError, match=f"choose one of: {registry.names[0]}"):
            registry.check("no-such-choice")


@pytest.mark.parametrize("section", ["bf16", "fp16"])
def test_a_quoted_switch_in_a_precision_section_is_refused_not_read_as_true(section):
    """"false" in quotes is a string, which DeepSpeed would read as true: bf16 would train."""
    with pytest.raises(ConfigError, match=rf"{section}.enabled must be true or false, but it is "
                                          r"'false' \(str\); write it without quotes"):
        make(**{section: {"enabled": "false"}})
    assert make(**{section: {"enabled": False}}).derived.precision == "fp32"


def test_a_zero_optimization_key_deepspeed_does_not_take_is_refused_before_launch():
    with pytest.raises(ConfigError, match=r"zero_optimization.stagee is not a DeepSpeed ZeRO "
                                          r"option \(did you mean: stage\?\)"):
        make(zero_optimization={"stage": 1, "stagee": 1})


def test_the_zero_keys_are_those_of_the_installed_deepspeed():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from megatron.neox_arguments.sections.deepspeed import ZERO_KEYS

    fields = DeepSpeedZeroConfig.model_fields
    assert set(ZERO_KEYS) == set(fields) | {f.alias for f in fields.values() if f.alias}
    assert DeepSpeedZeroConfig.model_config.get("extra") == "forbid"
