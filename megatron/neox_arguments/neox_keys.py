"""GPT-NeoX's config keys that are not fields here: renamed, runtime-only, or not implemented yet.

Every key of GPT-NeoX's `neox_args.py` and `deepspeed_args.py` is either a field of a section, a
renamed key (accepted with a warning naming the new one), a value GPT-NeoX computes at run time
(refused: it is derived here too), or listed in `NOT_YET_IMPLEMENTED` (refused with that reason;
a null or false value is accepted with a warning because it only switches the feature off).
"""

from __future__ import annotations

# Old GPT-NeoX names -> the key that replaces them here.
RENAMED: dict[str, str] = {
    "save_interval": "checkpoint_factor",
    "batch_size": "train_micro_batch_size_per_gpu",
    "gas": "gradient_accumulation_steps",
    "clip_grad": "gradient_clipping",
}

# Values GPT-NeoX fills in itself; here they are derived (see `args.derived`) or not config.
RUNTIME_KEYS: dict[str, str] = {
    "world_size": "derived from num_nodes * num_gpus (see args.derived.world_size)",
    "global_num_gpus": "derived from num_nodes * num_gpus (see args.derived.world_size)",
    "is_pipe_parallel": "derived from pipe_parallel_size (see args.derived.is_pipe_parallel)",
    "lr": "read from optimizer.params.lr",
    "optimizer_type": "read from optimizer.type",
    "zero_stage": "read from zero_optimization.stage",
    "zero_reduce_scatter": "read from zero_optimization.reduce_scatter",
    "zero_contiguous_gradients": "read from zero_optimization.contiguous_gradients",
    "zero_reduce_bucket_size": "read from zero_optimization.reduce_bucket_size",
    "zero_allgather_bucket_size": "read from zero_optimization.allgather_bucket_size",
    "padded_vocab_size": "computed from the tokenizer (see padded_vocab_size)",
    "dynamic_loss_scale": "set by fp16.loss_scale (0 means dynamic)",
    "save_iters": "derived from checkpoint_factor (see args.derived.save_iters)",
    "local_rank": "set by the launcher in each worker's environment",
    "rank": "set by the launcher in each worker's environment",
    "user_script": "the script given to deepy.py",
    "config_files": "the config files are saved beside every checkpoint",
    "git_hash": "recorded in checkpoint metadata",
    "deepspeed": "DeepSpeed is always used",
    "do_train": "set during training",
    "do_valid": "set during training",
    "do_test": "set during training",
    "tokenizer": "built from tokenizer_type",
    "tensorboard_writer": "built from tensorboard_dir",
    "adlr_autoresume_object": "set during training",
    "comet_experiment": "set during training",
    "curriculum_seqlen": "set during training",
}

# DeepSpeed config entries GPT-NeoX passes through; here they go inside deepspeed_extra_args.
DEEPSPEED_PASSTHROUGH = frozenset({
    "amp", "autotuning", "checkpoint", "comms_logger", "communication_data_type",
    "compression_training", "csv_monitor", "curriculum_learning", "data_efficiency",
    "data_types", "dump_state", "elasticity", "flops_profiler", "gradient_predivide_factor",
    "prescale_gradients", "sparse_attention", "sparse_gradients", "tensorboard", "wandb",
    "activation_checkpointing",
})

NOT_YET_IMPLEMENTED: frozenset[str] = frozenset({
    # parallelism / MoE
    "expert_interval", "moe_top_k", "use_tutel", "moe_num_experts", "moe_loss_coeff",
    "moe_train_capacity_factor", "moe_eval_capacity_factor", "moe_min_capacity",
    "moe_token_dropping", "create_moe_param_group", "moe_use_residual",
    "moe_expert_parallel_size", "moe_type", "moe_glu", "moe_lbl_in_fp32", "moe_jitter_eps",
    "enable_expert_tensor_parallelism",
    # model
    "expansion_factor", "rmsnorm_fusion", "use_qk_layernorm", "rpe_num_buckets",
    "rpe_max_distance", "opt_pos_emb_offset", "sparsity_config", "num_unique_layers",
    "param_sharing_style", "use_flashattn_swiglu", "fp16_lm_cross_entropy",
    "apply_query_key_layer_scaling", "use_cpu_initialization", "rotary_save_freqs_buffer",
    "gmlp_attn_dim", "soft_prompt_tuning", "mamba_selective_scan_fusion",
    "mamba_causal_conv_fusion", "mamba_inner_func_fusion", "mamba_selective_fp32_params",
    "mamba_use_bias_in_conv", "mamba_use_bias_in_linears", "dim_att", "head_size", "ffn_dim",
    "te_columnparallel", "te_rowparallel", "te_layernorm_mlp", "te_mha", "te_fp8_format",
    "te_fp8_wgrad", "te_fp8_amax_history_len", "te_fp8_amax_compute_algo", "te_fp8_margin",
    "te_fp8_mha",
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
    "deepscale_config", "load_universal",
    # data: other dataset kinds and training objectives
    "use_shared_fs", "pack_impl", "dataset_impl", "train_impl", "allow_chopped",
    "train_label_data_paths", "test_label_data_paths", "valid_label_data_paths",
    "train_reward_data_paths", "test_reward_data_paths", "valid_reward_data_paths",
    "pos_train_data_paths", "neg_train_data_paths", "pos_valid_data_paths",
    "neg_valid_data_paths", "pos_test_data_paths", "neg_test_data_paths",
    "pos_train_label_data_paths", "neg_train_label_data_paths", "pos_valid_label_data_paths",
    "neg_valid_label_data_paths", "pos_test_label_data_paths", "neg_test_label_data_paths",
    "dpo_fp32", "dpo_reference_free", "dpo_beta", "kto_fp32", "kto_desirable_weight",
    "kto_undesirable_weight", "kto_beta", "z_loss",
    # checkpoints
    "s3_path", "s3_chunk_size", "checkpoint_validation_with_forward_pass",
    # logging and profiling
    "wandb_init_all_ranks", "use_comet", "comet_workspace", "comet_project",
    "comet_experiment_name", "comet_tags", "comet_others", "log_grad_pct_zeros",
    "log_param_norm", "log_optimizer_states", "log_gradient_noise_scale",
    "gradient_noise_scale_n_batches", "gradient_noise_scale_cpu_offload", "memory_profiling",
    "memory_profiling_path", "profile", "profile_step_start", "profile_step_stop",
    # text generation
    "precompute_model_name", "return_logits",
    # launcher (DeepSpeed runner)
    "force_multi", "detect_nvlink_pairs", "autotuning_run", "no_ssh_check",
}) | DEEPSPEED_PASSTHROUGH


def not_implemented_reason(key: str) -> str:
    """Why a GPT-NeoX key in NOT_YET_IMPLEMENTED is refused, and what to do instead."""
    text = f"'{key}' is a GPT-NeoX option this project does not implement yet"
    if key in DEEPSPEED_PASSTHROUGH:
        text += "; to pass it to DeepSpeed unchanged, put it inside deepspeed_extra_args"
    return text + "; remove it from the config"
