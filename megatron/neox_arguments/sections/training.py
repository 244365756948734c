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
        None, "Stop training after an iteration divisible by this, as GPT-NeoX: without a "
        "checkpoint beyond that iteration's scheduled one (null: run to train_iters)."
    )
    bad_step_policy: str = option(
        "skip",
        "A step with a non-finite loss or gradient (or a loss spike): skip (not applied; the run "
        "stops after max_bad_steps in a row), stop, or rollback (to the newest good checkpoint, "
        "skipping the batches since).",
    )
    loss_spike_factor: float | None = option(
        None, "A loss above this factor times the mean of the last loss_spike_window good "
        "losses is a bad step (null: spikes are not checked)."
    )
    loss_spike_window: int = option(100, "Good steps whose mean loss_spike_factor compares with.")
    max_bad_steps: int = option(
        10, "Bad steps in a row bad_step_policy skip tolerates before the run stops."
    )
    max_rollbacks: int = option(
        3, "Rollbacks bad_step_policy rollback makes before the run stops."
    )
    train_impl: str = option(
        "normal",
        "Training objective: normal (next-token loss; with label files, only on the positions "
        "they keep: SFT), dpo (direct preference optimisation on chosen/rejected pairs), kto "
        "(Kahneman-Tversky optimisation on documents with rewards) or rm (a reward model: a "
        "value head trained on pairs).",
    )
    dpo_beta: float = option(0.1, "DPO: beta, the weight of the log-ratio difference.")
    dpo_fp32: bool = option(True, "DPO: compute the log-probabilities in fp32.")
    dpo_reference_free: bool = option(
        False, "DPO: no reference model; the reference log-probabilities are taken as 0."
    )
    reference_load: str | None = option(
        None, "DPO, KTO: where the reference model's checkpoint is now, when it has moved since "
        "the run started; a resumed run otherwise reloads it from the path its checkpoints "
        "recorded. A step directory (global_stepN) or the directory holding it; it must be the "
        "recorded checkpoint: the same iteration and the same manifest."
    )
    kto_beta: float = option(0.1, "KTO: beta, the weight of the log-ratio.")
    kto_fp32: bool = option(True, "KTO: compute the log-probabilities in fp32.")
    kto_desirable_weight: float = option(
        1.0, "KTO: weight of the loss of desirable (reward > 0) documents."
    )
    kto_undesirable_weight: float = option(
        1.0, "KTO: weight of the loss of undesirable (reward < 0) documents."
    )
    z_loss: float = option(
        0.0, "Reward model: coefficient of the penalty on squared values (keeps them near 0)."
    )
    hang_timeout_minutes: float | None = option(
        10.0,
        "Hang watchdog: a train or eval step running longer than this, or than hang_step_factor "
        "times the median step if longer, ends the job with code 124 after every live rank "
        "prints its stack and names the ranks not progressing (0 or null: no watchdog).",
    )
    hang_step_factor: float = option(
        20.0, "Multiple of the median train step a step may take (0: hang_timeout_minutes only)."
    )
    hang_timeout_checkpoint_minutes: float | None = option(
        60.0,
        "Hang watchdog limit of a checkpoint save or load, and of the first step after start-up "
        "(warm-up) when longer than the step limit (0 or null: saves and loads not watched).",
    )
