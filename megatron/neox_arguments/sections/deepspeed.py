"""The deepspeed section: ZeRO, fp16 / bf16 options and pass-through DeepSpeed config keys."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option

# Keys DeepSpeed 0.19 accepts inside "fp16" and "bf16"; "fp16" and "type" are GPT-NeoX
# (DeeperSpeed) extras that are read here and never passed on.
FP16_KEYS = (
    "enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
    "hysteresis", "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads",
)
BF16_KEYS = (
    "enabled", "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
    "bf16_optimizer_states",
)
NEOX_FP16_EXTRA_KEYS = ("fp16", "type")
# the true/false keys among them: a quoted "false" would be truthy where DeepSpeed reads it
SWITCH_KEYS = ("enabled", "auto_cast", "consecutive_hysteresis", "fp16_master_weights_and_grads",
               "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
               "bf16_optimizer_states")
# Keys DeepSpeed 0.19's ZeRO config (DeepSpeedZeroConfig, which forbids any other) accepts,
# names and aliases; tests/neox_arguments compares this list with the installed DeepSpeed
ZERO_KEYS = (
    "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "compute_grad_norm",
    "contiguous_gradients", "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory",
    "elastic_checkpoint", "enable_sanity_checks", "gather_16bit_weights_on_model_save",
    "ignore_unused_parameters", "leaf_module", "legacy_stage1", "load_from_fp32_weights",
    "log_trace_cache_warnings", "max_live_parameters", "max_reuse_distance",
    "memory_efficient_linear", "model_persistence_threshold", "module_granularity_threshold",
    "offload_optimizer", "offload_param", "overlap_comm", "override_module_apply",
    "param_persistence_threshold", "parameter_alignment", "pipeline_loading_checkpoint",
    "prefetch_bucket_size", "reduce_bucket_size", "reduce_scatter", "round_robin_gradients",
    "save_muon_momentum_buffer_in_memory", "stage", "stage3_allgather_sequential",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_model_persistence_threshold", "stage3_module_granularity_threshold",
    "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size",
    "stage3_use_all_reduce_for_fetch_params", "sub_group_size", "use_all_reduce_for_fetch_params",
    "use_multi_rank_bucket_allreduce", "zenflow", "zero_hpz_partition_size",
    "zero_quantized_gradients", "zero_quantized_nontrainable_weights", "zero_quantized_weights",
)
# DeepSpeed's spellings of the dtypes data_types.grad_accum_dtype may name, by precision.
GRAD_ACCUM_DTYPES = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16",
                     "bf16": "bf16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class DeepSpeedArgs:
    """Engine options that `deepspeed_config(args)` turns into DeepSpeed's JSON config."""

    zero_optimization: dict = option(
        {"stage": 0},
        "DeepSpeed ZeRO options as DeepSpeed documents them; stage 0-3 (2 and 3 need "
        "pipe_parallel_size 0: DeepSpeed's pipeline engine takes stage 0 and 1 only).",
    )
    fp16: dict | None = option(
        None,
        "DeepSpeed fp16 options (enabled, loss_scale 0 = dynamic, loss_scale_window, "
        "hysteresis, min_loss_scale, initial_scale_power).",
    )
    bf16: dict | None = option(None, "DeepSpeed bf16 options, e.g. {enabled: true}.")
    data_types: dict | None = option(
        None,
        "DeepSpeed's data_types, e.g. {grad_accum_dtype: fp32}: accumulate gradients in that "
        "dtype; one other than the precision's needs ZeRO stage 1 or 2 (bf16 with fp32 and "
        "stage 1 runs DeepSpeed's bf16 optimizer).",
    )
    fp32_allreduce: bool = option(
        False, "Under fp16/bf16, sum in float32: the data-parallel gradient all-reduce "
        "(DeepSpeed's communication_data_type fp32) and, as GPT-NeoX, the tensor-parallel "
        "all-reduces of activations and their gradients."
    )
    zero_allow_untested_optimizer: bool = option(
        True, "Let ZeRO wrap the torch optimizers this project builds (keep true)."
    )
    deepspeed_extra_args: dict | None = option(
        None, "Further DeepSpeed config entries merged into the generated JSON config as given."
    )

    @property
    def zero_stage(self) -> int:
        """ZeRO stage from zero_optimization (0 when not given)."""
        return int(self.zero_optimization.get("stage", 0))
