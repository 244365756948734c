"""The logging section: log files, intervals, TensorBoard and Weights & Biases."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option


@dataclass(frozen=True)
class LoggingArgs:
    """What is reported during a run and where it goes."""

    log_dir: str | None = option(None, "Directory for log files (null: stderr only).")
    log_interval: int = option(100, "Iterations between training-metric log lines.")
    steps_per_print: int = option(10, "Iterations between DeepSpeed's own progress prints.")
    tensorboard_dir: str | None = option(
        None, "Directory for TensorBoard event files (null: no TensorBoard)."
    )
    use_wandb: bool | None = option(
        None, "Log metrics to Weights & Biases: true, false, or null (GPT-NeoX's default: on "
        "when wandb is installed and credentials reach the worker, WANDB_API_KEY or ~/.netrc)."
    )
    wandb_project: str = option("neox", "Weights & Biases project name.")
    wandb_group: str | None = option(None, "Weights & Biases group that gathers related runs.")
    wandb_team: str | None = option(None, "Weights & Biases team (entity).")
    wandb_host: str = option("https://api.wandb.ai", "URL of the Weights & Biases server.")
    wandb_run_name: str | None = option(
        None, "Weights & Biases run name (null: W&B picks one)."
    )
    wall_clock_breakdown: bool = option(
        False, "Time forward, backward and optimizer step separately (DeepSpeed)."
    )
    log_grad_norm: bool = option(False, "Log the global gradient norm every log_interval.")
    log_level: str = option(
        "info", "Log level of the project's logger: debug, info, warning or error."
    )
