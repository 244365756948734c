"""The training section: iteration counts, the batch-size triple, seed, precision mode."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option


@dataclass(frozen=True)
class TrainingArgs:
    """How long and with what batch the run trains; any two of the batch triple give the third."""

    train_iters: int | None = option(None, "Number of optimizer steps to train for (required).")
    train_micro_batch_size_per_gpu: int | None = option(
        None, "Sequences per rank per forward/backward pass."
    )
    gradient_accumulation_steps: int | None = option(
        None, "Micro-batches accumulated per optimizer step; null means derived (1 if unknown)."
    )
    train_batch_size: int | None = option(
        None,
        "Sequences per optimizer step over all data-parallel ranks "
        "(= micro batch * gradient accumulation * data-parallel size).",
    )
    seed: int = option(1234, "Seed of python, numpy and torch random number generators.")
    eval_interval: int = option(1000, "Iterations between validation runs during training.")
    eval_iters: int = option(100, "Validation/test iterations per evaluation.")
    precision: str | None = option(
        None,
        "Training precision: fp32, fp16 or bf16 (bfloat16 also accepted); null means "
        "decided by the fp16 / bf16 sections.",
    )
    exit_interval: int | None = option(
        None, "Stop training after an iteration divisible by this (null: run to train_iters)."
    )
