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
# DeepSpeed's spellings of the dtypes data_types.grad_accum_dtype may name, by precision.
GRAD_ACCUM_DTYPES = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16",
                     "bf16": "bf16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class DeepSpeedArgs:
    """Engine options that `deepspeed_config(args)` turns into DeepSpeed's JSON config."""

    zero_optimization: dict = option(
        {"stage": 0},
        "DeepSpeed ZeRO options as DeepSpeed documents them; stage 0-3 (2 and 3 need "
        "pipe_parallel_size < 2).",
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
        False, "All-reduce gradients in float32 under fp16/bf16 (communication_data_type fp32)."
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
