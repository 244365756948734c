"""The checkpoint section: where to save and load, how often, and what to skip."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option


@dataclass(frozen=True)
class CheckpointArgs:
    """Saving and resuming."""

    save: str | None = option(None, "Directory to save checkpoints to (null: never save).")
    load: str | None = option(None, "Directory to load a checkpoint from (null: start fresh).")
    checkpoint_factor: int | float | None = option(
        None,
        "Save spacing: every checkpoint_factor iterations (linear), or at iterations "
        "multiplied by it each time (log); required when save is set unless extra_save_iters is.",
    )
    extra_save_iters: list[int] | None = option(
        None, "Additional iterations at which to save a checkpoint; 0 saves the untrained "
        "model before the first step of a run at iteration 0."
    )
    keep_last_n_checkpoints: int | None = option(
        None, "Delete older checkpoints, keeping this many, and never the one the run loaded "
        "nor the newest with a finite loss (null: keep all)."
    )
    checkpoint_scale: str = option(
        "linear", "How checkpoint_factor spaces saves: linear or log."
    )
    no_save_optim: bool = option(False, "Do not save optimizer state.")
    no_save_rng: bool = option(False, "Do not save random-number-generator state.")
    no_load_optim: bool = option(False, "Do not load optimizer state.")
    no_load_rng: bool = option(False, "Do not load random-number-generator state.")
    finetune: bool = option(
        False,
        "Load only the weights: skip optimizer and rng state and start again at iteration 0.",
    )
    iteration: int | None = option(
        None, "Load the checkpoint of this iteration instead of the latest one."
    )
    allow_data_change: bool = option(
        False,
        "Resume even though the token files differ from those the checkpoint was trained on "
        "(their content fingerprints are stored in every checkpoint).",
    )
    save_on_signal: bool = option(
        True, "On SIGTERM (preemption), SIGUSR1 (SLURM's warning) or Ctrl-C, finish the step and "
        "save a checkpoint before "
        "exiting (false: exit after the step without saving)."
    )
