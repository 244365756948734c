"""GPT-NeoX's config keys that are not fields here: renamed, runtime-only, or not implemented yet.

Every key of GPT-NeoX's `neox_args.py` and `deepspeed_args.py` is either a field of a section, a
renamed key (accepted with a warning naming the new one), a value GPT-NeoX computes at run time
(`RUNTIME_KEYS`), or an option not implemented here (`NOT_YET_IMPLEMENTED`). A key of the last
two kinds is accepted only at GPT-NeoX's default value (`NEOX_DEFAULTS`): that changes nothing,
so it is dropped silently and never stored. Any other value is refused with the reason. A switch
whose default is false is also off when null.

`NEOX_DEFAULTS` was generated once from the dataclass defaults in GPT-NeoX's
megatron/neox_arguments/neox_args.py and deepspeed_args.py at commit
ea7aefd8f8e183256992d9fede4d7c71a46d67a5. `git_hash` has no literal default there (GPT-NeoX
computes it from its checkout), so it is refused at any value.
"""

from __future__ import annotations

import json
from typing import Any

# Old GPT-NeoX names -> the key that replaces them here.
RENAMED: dict[str, str] = {
    "save_interval": "checkpoint_factor",
    "gas": "gradient_accumulation_steps",
}

# Values GPT-NeoX fills in itself; here they are derived (see `args.derived`) or not config.
RUNTIME_KEYS: dict[str, str] = {
    "world_size": "derived from num_nodes * num_gpus (see args.derived.world_size)",
    "is_pipe_parallel": "derived from pipe_parallel_size (see args.derived.is_pipe_parallel)",
    "lr": "read from optimizer.params.lr",
    # GPT-NeoX declares these two and overwrites them with the values they copy, so a value
    # written there trains nothing: accepted at GPT-NeoX's default only
    "batch_size": "read from train_micro_batch_size_per_gpu, as GPT-NeoX overwrites batch_size "
                  "with it",
    "clip_grad": "read from gradient_clipping, as GPT-NeoX overwrites clip_grad with it",
    "optimizer_type": "read from optimizer.type",
    "zero_stage": "read from zero_optimization.stage",
    "zero_reduce_scatter": "read from zero_optimization.reduce_scatter",
    "zero_contiguous_gradients": "read from zero_optimization.contiguous_gradients",
    "zero_reduce_bucket_size": "read from zero_optimization.reduce_bucket_size",
    "zero_allgather_bucket_size": "read from zero_optimization.allgather_bucket_size",
    "padded_vocab_size": "computed from the tokenizer (see padded_vocab_size)",
    "dynamic_loss_scale": "set by fp16.loss_scale (0 means dynamic)",
    "local_rank": "set by the launcher in each worker's environment",
    "rank": "set by the launcher in each worker's environment",
    "user_script": "the script given to deepy.py",
    "config_files": "written beside every checkpoint (the merged config)",
    "git_hash": "recorded in checkpoint metadata",
    "deepspeed": "always true here (DeepSpeed is always used)",
    "do_train": "set during training",
    "do_valid": "set during training",
    "do_test": "set during training",
    "comet_experiment": "set during training",
    "curriculum_seqlen": "set during training",
}

# DeepSpeed config entries GPT-NeoX passes through; here they go inside deepspeed_extra_args.
DEEPSPEED_PASSTHROUGH = frozenset({
    "amp", "autotuning", "checkpoint", "comms_logger", "communication_data_type",
    "compression_training", "csv_monitor", "curriculum_learning", "data_efficiency",
    "dump_state", "elasticity", "flops_profiler", "gradient_predivide_factor",
    "prescale_gradients", "sparse_attention", "sparse_gradients", "tensorboard", "wandb",
    "activation_checkpointing",
})

NOT_YET_IMPLEMENTED: frozenset[str] = frozenset({
    # model
    "expansion_factor", "use_qk_layernorm", "rpe_num_buckets",
    "rpe_max_distance", "opt_pos_emb_offset", "sparsity_config", "num_unique_layers",
    "param_sharing_style", "fp16_lm_cross_entropy",
    "apply_query_key_layer_scaling", "use_cpu_initialization", "rotary_save_freqs_buffer",
    "gmlp_attn_dim", "soft_prompt_tuning", "dim_att", "head_size", "ffn_dim",
    "te_columnparallel", "te_rowparallel", "te_layernorm_mlp", "te_mha", "te_fp8_format",
    "te_fp8_wgrad", "te_fp8_amax_history_len", "te_fp8_amax_compute_algo", "te_fp8_margin",
    "te_fp8_mha", "fused_kernels_build_path",
    # optimizer / schedule
    "use_bnb_optimizer", "scheduler",
    # mup
    "use_mup", "coord_check", "save_base_shapes", "base_shapes_file", "mup_init_scale",
    "mup_attn_temp", "mup_output_temp", "mup_embedding_mult", "mup_rp_embedding_mult",
    "mup_width_scale",
    # training
    "train_epochs", "char_level_ppl", "profile_backward", "deepspeed_activation_checkpointing",
    "hysteresis", "loss_scale", "loss_scale_window", "min_scale", "short_seq_prob",
    "lazy_mpu_init", "adlr_autoresume", "adlr_autoresume_interval", "onnx_safe", "deepscale",
    "deepscale_config",
    # data and training objectives: online REINFORCE
    "use_shared_fs", "fp32_reinforce", "kl_div_beta", "kl_impl", "reinforce_leave_one_out",
    # online data serving and weight serving
    "online_dataserver_ips", "online_dataserver_ports", "serve_model_weights",
    "weight_server_port",
    # checkpoints
    "s3_path", "s3_chunk_size", "checkpoint_validation_with_forward_pass",
    # logging and profiling
    "wandb_init_all_ranks", "log_grad_pct_zeros",
    "log_param_norm", "log_optimizer_states", "log_gradient_noise_scale",
    "gradient_noise_scale_n_batches", "gradient_noise_scale_cpu_offload",
    # text generation
    "precompute_model_name", "return_logits",
    # launcher (DeepSpeed runner)
    "force_multi", "autotuning_run",
}) | DEEPSPEED_PASSTHROUGH

# GPT-NeoX's default of every key in RUNTIME_KEYS (but git_hash) and NOT_YET_IMPLEMENTED.
NEOX_DEFAULTS: dict[str, Any] = {
    "activation_checkpointing": None,
    "adlr_autoresume": False,
    "adlr_autoresume_interval": 1000,
    "amp": None,
    "apply_query_key_layer_scaling": False,
    "autotuning": None,
    "autotuning_run": None,
    "base_shapes_file": None,
    "batch_size": None,
    "char_level_ppl": False,
    "checkpoint": None,
    "checkpoint_validation_with_forward_pass": False,
    "clip_grad": 1.0,
    "comet_experiment": None,
    "comms_logger": None,
    "communication_data_type": None,
    "compression_training": None,
    "config_files": None,
    "coord_check": False,
    "csv_monitor": None,
    "curriculum_learning": None,
    "curriculum_seqlen": 0,
    "data_efficiency": None,
    "deepscale": False,
    "deepscale_config": None,
    "deepspeed": True,
    "deepspeed_activation_checkpointing": True,
    "dim_att": None,
    "do_test": None,
    "do_train": None,
    "do_valid": None,
    "dump_state": False,
    "dynamic_loss_scale": None,
    "elasticity": None,
    "expansion_factor": None,
    "ffn_dim": None,
    "flops_profiler": None,
    "force_multi": False,
    "fp16_lm_cross_entropy": False,
    "fp32_reinforce": True,
    "fused_kernels_build_path": None,
    "gmlp_attn_dim": 64,
    "gradient_noise_scale_cpu_offload": False,
    "gradient_noise_scale_n_batches": 5,
    "gradient_predivide_factor": 1.0,
    "head_size": None,
    "hysteresis": 2,
    "is_pipe_parallel": False,
    "kl_div_beta": 0.1,
    "kl_impl": "mse",
    "lazy_mpu_init": False,
    "local_rank": None,
    "log_grad_pct_zeros": False,
    "log_gradient_noise_scale": False,
    "log_optimizer_states": False,
    "log_param_norm": False,
    "loss_scale": None,
    "loss_scale_window": 1000.0,
    "lr": None,
    "min_scale": 1.0,
    "mup_attn_temp": 1.0,
    "mup_embedding_mult": 1.0,
    "mup_init_scale": 1.0,
    "mup_output_temp": 1.0,
    "mup_rp_embedding_mult": 1.0,
    "mup_width_scale": 2,
    "num_unique_layers": None,
    "online_dataserver_ips": "localhost",
    "online_dataserver_ports": 10000,
    "onnx_safe": False,
    "opt_pos_emb_offset": 0,
    "optimizer_type": "adam",
    "padded_vocab_size": None,
    "param_sharing_style": "grouped",
    "precompute_model_name": None,
    "prescale_gradients": False,
    "profile_backward": False,
    "rank": None,
    "reinforce_leave_one_out": False,
    "return_logits": False,
    "rotary_save_freqs_buffer": False,
    "rpe_max_distance": 128,
    "rpe_num_buckets": 32,
    "s3_chunk_size": 104857600,
    "s3_path": None,
    "save_base_shapes": False,
    "scheduler": None,
    "serve_model_weights": False,
    "short_seq_prob": 0.1,
    "soft_prompt_tuning": None,
    "sparse_attention": None,
    "sparse_gradients": False,
    "sparsity_config": None,
    "te_columnparallel": False,
    "te_fp8_amax_compute_algo": "most_recent",
    "te_fp8_amax_history_len": 1,
    "te_fp8_format": "hybrid",
    "te_fp8_margin": 0,
    "te_fp8_mha": False,
    "te_fp8_wgrad": True,
    "te_layernorm_mlp": False,
    "te_mha": False,
    "te_rowparallel": False,
    "tensorboard": None,
    "train_epochs": None,
    "use_bnb_optimizer": False,
    "use_cpu_initialization": False,
    "use_mup": False,
    "use_qk_layernorm": False,
    "use_shared_fs": True,
    "user_script": None,
    "wandb": None,
    "wandb_init_all_ranks": False,
    "weight_server_port": 6000,
    "world_size": None,
    "zero_allgather_bucket_size": None,
    "zero_contiguous_gradients": None,
    "zero_reduce_bucket_size": None,
    "zero_reduce_scatter": None,
    "zero_stage": None,
}


def show(value: Any) -> str:
    """A value as it would be written in a config (JSON/YAML spelling), shortened."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def same_value(value: Any, default: Any) -> bool:
    """Whether `value` equals `default`: 0 == 0.0, lists == tuples, numeric strings are numbers,
    but true is not 1."""
    if isinstance(value, bool) or isinstance(default, bool) or value is None or default is None:
        return value is default
    if isinstance(default, (int, float)) and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return False
    if isinstance(value, (int, float)) and isinstance(default, (int, float)):
        return float(value) == float(default)
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return len(value) == len(default) and all(map(same_value, value, default))
    if isinstance(value, dict) and isinstance(default, dict):
        return value.keys() == default.keys() and all(
            same_value(value[k], default[k]) for k in value
        )
    return type(value) is type(default) and value == default


def is_neox_default(key: str, value: Any) -> bool:
    """Whether a RUNTIME_KEYS or NOT_YET_IMPLEMENTED key set to `value` changes nothing."""
    if key not in NEOX_DEFAULTS:
        return False
    default = NEOX_DEFAULTS[key]
    if key in NOT_YET_IMPLEMENTED and default is False:
        return value is None or value is False  # a switch left off
    return same_value(value, default)


def default_clause(key: str, value: Any) -> str:
    """What the key is set to and the only value accepted (GPT-NeoX's default)."""
    if key not in NEOX_DEFAULTS:
        return f"it is set to {show(value)}, and no value is accepted"
    return (
        f"it is set to {show(value)}, and only GPT-NeoX's default ({show(NEOX_DEFAULTS[key])}, "
        "which changes nothing) is accepted"
    )


# Keys of GPT-NeoX's online REINFORCE training (train_impl reinforce), refused as a whole.
ONLINE_TRAINING_KEYS = frozenset({
    "fp32_reinforce", "kl_div_beta", "kl_impl", "reinforce_leave_one_out",
    "online_dataserver_ips", "online_dataserver_ports", "serve_model_weights",
    "weight_server_port",
})


def not_implemented_reason(key: str, value: Any) -> str:
    """Why a GPT-NeoX key in NOT_YET_IMPLEMENTED set to `value` is refused, and what to do."""
    what = ("an option of GPT-NeoX's online REINFORCE training (train_impl reinforce, fed by a "
            "generation server), which this project does not support: use train_impl dpo, kto "
            "or rm on offline data" if key in ONLINE_TRAINING_KEYS
            else "a GPT-NeoX option this project does not implement yet")
    text = f"'{key}' is {what}; {default_clause(key, value)}"
    if key in DEEPSPEED_PASSTHROUGH:
        text += "; to pass it to DeepSpeed unchanged, put it inside deepspeed_extra_args"
    return text + "; remove it from the config"
