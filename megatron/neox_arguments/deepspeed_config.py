"""The one place DeepSpeed's JSON config is made: `deepspeed_config(args) -> dict`.

DeepSpeed receives the batch triple, clipping, ZeRO, precision and logging switches. It never
receives "optimizer" or "scheduler": the torch optimizer and the learning-rate schedule are built
by this project and handed to `deepspeed.initialize`, so "zero_allow_untested_optimizer" is set.
"""

from __future__ import annotations

import copy
from typing import Any

from .derived import activation_checkpoints
from .sections.deepspeed import NEOX_FP16_EXTRA_KEYS


def deepspeed_config(args: Any) -> dict[str, Any]:
    """DeepSpeed's config dict for a validated `NeoXArgs` (at its derived world size)."""
    d, ds = args.derived, args.deepspeed
    zero = copy.deepcopy(ds.zero_optimization)
    zero.setdefault("stage", 0)
    config: dict[str, Any] = {
        "train_batch_size": d.train_batch_size,
        "train_micro_batch_size_per_gpu": d.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": d.gradient_accumulation_steps,
        "gradient_clipping": args.optimizer.gradient_clipping,
        "zero_optimization": zero,
        "steps_per_print": args.logging.steps_per_print,
        "wall_clock_breakdown": args.logging.wall_clock_breakdown,
        "zero_allow_untested_optimizer": ds.zero_allow_untested_optimizer,
    }
    if d.precision == "fp16":
        fp16 = {k: v for k, v in (ds.fp16 or {}).items() if k not in NEOX_FP16_EXTRA_KEYS}
        config["fp16"] = {**fp16, "enabled": True}
    elif d.precision == "bf16":
        config["bf16"] = {**copy.deepcopy(ds.bf16 or {}), "enabled": True}
    if ds.data_types:
        config["data_types"] = copy.deepcopy(ds.data_types)
    if ds.fp32_allreduce and d.precision != "fp32":
        config["communication_data_type"] = "fp32"
    p = args.parallelism
    if p.checkpoint_activations:
        config["activation_checkpointing"] = {
            "partition_activations": p.partition_activations,
            "contiguous_memory_optimization": p.contiguous_checkpointing,
            "cpu_checkpointing": p.checkpoint_in_cpu,
            "synchronize_checkpoint_boundary": p.synchronize_each_layer,
            "number_checkpoints": activation_checkpoints(
                args.model.num_layers, p.checkpoint_num_layers, p.pipe_parallel_size),
        }
    config.update(copy.deepcopy(ds.deepspeed_extra_args or {}))
    return config
