"""The logging section: log files, intervals, TensorBoard, Weights & Biases and Comet."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option


@dataclass(frozen=True)
class LoggingArgs:
    """What is reported during a run and where it goes."""

    log_dir: str | None = option(None, "Directory for log files (null: stderr only).")
    log_interval: int = option(100, "Iterations between training-metric log lines.")
    steps_per_print: int = option(
        10, "Iterations between DeepSpeed's own progress prints (shown at log_level debug)."
    )
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
    wandb_host: str = option(
        "https://api.wandb.ai", "URL of the Weights & Biases server; its ~/.netrc entry counts as "
        "credentials (at this default, a WANDB_BASE_URL set in the environment is used instead)."
    )
    wandb_run_name: str | None = option(
        None, "Weights & Biases run name (null: W&B picks one)."
    )
    use_comet: bool | None = option(
        None, "Log metrics to a Comet experiment: true; false or null (GPT-NeoX's default) for "
        "off. Offline (an archive under log_dir/comet) when no COMET_API_KEY or ~/.comet.config "
        "key reaches the worker."
    )
    comet_workspace: str | None = option(
        None, "Comet workspace (null: the API key's default workspace)."
    )
    comet_project: str | None = option(
        None, "Comet project (null: Comet's Uncategorized Experiments)."
    )
    comet_experiment_name: str | None = option(
        None, "Comet experiment name (null: Comet picks one)."
    )
    comet_tags: list[str] | None = option(None, "Tags attached to the Comet experiment.")
    comet_others: dict | None = option(
        None, "Metadata attached to the Comet experiment as its 'others' (key: value)."
    )
    wall_clock_breakdown: bool = option(
        False, "Time forward, backward and optimizer step separately (DeepSpeed)."
    )
    profile: bool = option(
        False, "Trace the steps after iteration profile_step_start up to profile_step_stop with "
        "torch.profiler on every rank, phases labelled: one rank<N>.<time>.pt.trace.json per rank "
        "in tensorboard_dir (else log_dir) for TensorBoard's profiler plugin or Perfetto; on CUDA "
        "also cudaProfilerStart/Stop around them, for nsys --capture-range=cudaProfilerApi."
    )
    profile_step_start: int = option(
        10, "profile and memory_profiling start after this iteration (GPT-NeoX's default 10 "
        "with profile_step_stop 12 profiles iterations 11 and 12)."
    )
    profile_step_stop: int = option(
        12, "profile and memory_profiling stop after this iteration (at most train_iters)."
    )
    memory_profiling: bool = option(
        False, "Record memory over the profiled steps on every rank into memory_profiling_path: "
        "memory_timeline_rank<N>.json (resident memory, and CUDA allocator bytes, per step) and, "
        "on CUDA, the allocator snapshot mem_snapshot_rank<N>.pickle for pytorch.org/memory_viz."
    )
    memory_profiling_path: str | None = option(
        None, "Directory for memory_profiling's files (required with it)."
    )
    log_grad_norm: bool = option(
        False, "Also log every parameter's gradient norm every log_interval, under its canonical "
        "name (gradient_norms/1.mlp.dense_4h_to_h.weight, ...); the global norm is always logged."
    )
    peak_theoretical_tflops: float | None = option(
        None, "Peak TFLOP/s of one GPU (e.g. 989 for an H100 SXM in bf16): log model TFLOP/s per "
        "GPU and MFU, in percent, against it (null: neither)."
    )
    log_level: str = option(
        "info", "Log level of deepy.py and the workers: debug, info, warning or error. debug also "
        "shows what DeepSpeed prints (its pipeline layout, its steps_per_print loss line).",
    )
