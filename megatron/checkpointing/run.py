"""What checkpoint saving and loading know of the run, besides its engine and the checkpoint
section of the config: a small description built once when the engine is built.

    run = RunDescription.from_args(args, optimizer_state=("exp_avg", "exp_avg_sq"))
    engine.run = run        # save_checkpoint(engine, args.checkpoint, ...) reads it there

The parallel degrees themselves come from the engine's topology; the model shape the
manifest records is `model_shape.describe_shape`; `sharding` says how each tensor is split over
tensor-parallel ranks; `optimizer_state` names the per-parameter state tensors the optimizer
keeps (declared by the optimizer registry), which resharding carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megatron.checkpointing.model_shape import describe_shape
from megatron.model.partition import Sharding


@dataclass(frozen=True)
class RunDescription:
    """The run as checkpoints see it (see the module docstring)."""

    pipe_parallel_size: int  # as configured: 0 means no PipelineModule
    zero_stage: int
    precision: str
    shape: dict  # model_shape.describe_shape, without the padded vocabulary
    sharding: Sharding
    optimizer_state: tuple[str, ...]
    config: dict = field(default_factory=dict, repr=False)  # the resolved config (manifest)
    config_yaml: str = field(default="", repr=False)  # config.yml beside the checkpoint
    # bf16/fp16 products on CPU tensors, fp32 or native (mpu/products.py), where the run has any
    cpu_products: str | None = None

    @classmethod
    def from_args(cls, args, optimizer_state: tuple[str, ...]) -> "RunDescription":
        shape = describe_shape(args, None)
        shape.pop("padded_vocab_size")
        return cls(pipe_parallel_size=args.parallelism.pipe_parallel_size,
                   zero_stage=args.derived.zero_stage, precision=args.derived.precision,
                   shape=shape, sharding=Sharding.for_activation(args.model.activation),
                   optimizer_state=tuple(optimizer_state), config=args.to_dict(),
                   config_yaml=args.to_yaml())
