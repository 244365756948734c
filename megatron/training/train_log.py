"""The training record of each log interval: its console line and its metrics.

Every `log_interval` iterations (and at the last one) one record goes to the trackers: the mean
`lm_loss` of the interval's applied steps (as GPT-NeoX, none when the optimizer skipped every
one), `learning_rate`, the unclipped global `grad_norm` of the last step,
`tokens_per_sec`, `iteration_time_ms`, `data_wait_ms`, `consumed_samples`, `memory_gib` (GPU
peak allocated under CUDA, else the process's RSS) and `skipped_iterations` (the interval's
steps the optimizer did not apply), plus `loss_scale` under fp16, as GPT-NeoX logs them. The
console line adds the elapsed time and an ETA at the run's mean pace. Two config keys
add to it, as in GPT-NeoX:

- `peak_theoretical_tflops`: `model_tflops_per_gpu`, the model TFLOP/s achieved per device
  (training FLOPs per token from megatron/training/flops.py x tokens per second / world size),
  and `mfu`, that figure over the peak in percent;
- `log_grad_norm`: `gradient_norms/<canonical name>` for every parameter, read at the last step
  of the interval (megatron/training/grad_norms.py).

A model with MoE layers adds their router losses and expert loads (megatron/training/moe_log.py).
"""

from __future__ import annotations

import time

from megatron.monitoring.trackers import MetricsTracker
from megatron.training.flops import mfu_percent, model_tflops_per_device
from megatron.training.grad_norms import GradNormProbe
from megatron.training.moe_log import MoEProbe
from megatron.training.step import loss_gradient_scale


class TrainLog:
    """Decides which iterations are logged and writes their record."""

    def __init__(self, args, engine, tracker: MetricsTracker, flops_per_token: float,
                 start_iteration: int = 0, model_config=None):
        self.tracker = tracker
        self._log_interval = args.logging.log_interval
        self._train_iters = args.training.train_iters
        self._tokens_per_iter = args.derived.train_batch_size * args.model.seq_length
        self._world_size = args.derived.world_size
        self._peak = args.logging.peak_theoretical_tflops
        self._flops_per_token = flops_per_token
        self._probe = GradNormProbe(engine) if args.logging.log_grad_norm else None
        self._moe = None
        if model_config is not None and model_config.moe_num_experts > 1:
            self._moe = MoEProbe(engine, model_config)
        self._start_iteration = start_iteration
        self._fp16 = engine.engine.fp16_enabled()
        self._skipped = engine.engine.skipped_steps  # DeepSpeed's count when the interval began
        self._start_time = time.perf_counter()
        self.train_seconds = 0.0  # in the logged intervals: steps only, no eval or save

    def tflops_per_gpu(self, tokens_per_sec: float | None) -> float | None:
        """Model TFLOP/s per device at `tokens_per_sec` (None without a rate)."""
        if not tokens_per_sec:
            return None
        return model_tflops_per_device(self._flops_per_token, tokens_per_sec, self._world_size)

    def is_logged(self, iteration: int) -> bool:
        return iteration % self._log_interval == 0 or iteration == self._train_iters

    def before_step(self, iteration: int) -> None:
        """Call before the step that completes `iteration`: a logged one reads gradient norms."""
        if self._probe is not None and self.is_logged(iteration):
            self._probe.arm()

    def log(self, engine, iteration: int, losses: list[float], consumed_samples: int,
            elapsed: float, data_wait: float, step_metrics: list[dict] | None = None,
            applied: list[bool] | None = None) -> None:
        """Record the interval of `len(losses)` iterations that ends at `iteration`, with the
        training objective's metrics of each step (`step_metrics`). As in GPT-NeoX, the loss
        and the objective's metrics are the means over the steps the optimizer applied
        (`applied`; all when not given): an interval of skipped steps only has none."""
        n = len(losses)
        applied = applied if applied is not None else [True] * n
        kept = [value for value, ok in zip(losses, applied) if ok]
        loss = sum(kept) / len(kept) if kept else None
        step_metrics = [m for m, ok in zip(step_metrics or [], applied) if ok]
        lr = engine.lr_scheduler.get_lr()[0]
        grad_norm = engine.engine.get_global_grad_norm()
        grad_norm = float(grad_norm) if grad_norm is not None else None
        iter_time = elapsed / n
        self.train_seconds += elapsed
        metrics = {"lm_loss": loss, "learning_rate": lr, "grad_norm": grad_norm,
                   "tokens_per_sec": self._tokens_per_iter / iter_time,
                   "iteration_time_ms": iter_time * 1e3, "data_wait_ms": data_wait / n * 1e3,
                   "consumed_samples": consumed_samples}
        for key in ("lm_loss", "grad_norm"):
            if metrics[key] is None:
                del metrics[key]
        metrics["memory_gib"] = memory_gib()
        skipped = max(0, engine.engine.skipped_steps - self._skipped)
        self._skipped = engine.engine.skipped_steps
        metrics["skipped_iterations"] = skipped
        scaling = ""
        if self._fp16:
            metrics["loss_scale"] = loss_gradient_scale(engine.engine)
            scaling = f"loss scale {metric_text(metrics['loss_scale'])} | "
        if skipped:
            scaling += f"skipped {skipped} | "
        objective = interval_means(engine.objective, step_metrics)
        metrics.update(objective)
        moe_metrics, moe_text = self._moe.take() if self._moe is not None else ({}, "")
        metrics.update(moe_metrics)
        loss_name = getattr(engine.objective, "loss_name", "lm_loss")
        shown = f"{loss:.4f}" if loss is not None else "- (no step applied)"
        line = (f" iteration {iteration:>6}/{self._train_iters} | {loss_name} {shown} | "
                + console_metrics(engine.objective, objective) + moe_text
                + f"lr {lr:.3e} | " + scaling
                + (f"grad_norm {grad_norm:.3f} | " if grad_norm is not None else "")
                + f"{metrics['tokens_per_sec']:,.0f} tokens/s | {iter_time * 1e3:.1f} ms/iter")
        if self._peak is not None:
            tflops = model_tflops_per_device(self._flops_per_token, metrics["tokens_per_sec"],
                                             self._world_size)
            metrics["model_tflops_per_gpu"] = tflops
            metrics["mfu"] = mfu_percent(tflops, self._peak)
            line += f" | {tflops:.2f} model TFLOP/s per GPU | MFU {metrics['mfu']:.2f}%"
        line += f" | mem {metrics['memory_gib']:.2f} GiB | " + self.progress(iteration)
        if self._probe is not None:
            metrics.update(self._probe.take())
        self.tracker.log(metrics, iteration, console=line)

    def progress(self, iteration: int) -> str:
        """`elapsed H:MM:SS, ETA H:MM:SS`: wall time since this run started training, and the
        remaining iterations at this run's mean pace so far (evaluations and saves included)."""
        elapsed = time.perf_counter() - self._start_time
        done = iteration - self._start_iteration
        left = max(self._train_iters - iteration, 0)
        eta = clock(elapsed / done * left) if done > 0 else "?"
        return f"elapsed {clock(elapsed)}, ETA {eta}"


def interval_means(objective, steps: list[dict]) -> dict:
    """The objective's metrics over an interval's steps: the mean of each (counts: per step)."""
    if not steps or objective is None:
        return {}
    return {name: sum(s[name] for s in steps) / len(steps) for name in objective.metric_names
            if all(name in s for s in steps)}


def console_metrics(objective, values: dict) -> str:
    """'name value | ' for each metric the objective shows on the console."""
    shown = getattr(objective, "console_metrics", ())
    return "".join(f"{k} {metric_text(v)} | " for k, v in values.items() if k in shown)


def metric_text(value: float) -> str:
    """A metric as the console shows it: counts as integers, the rest with 4 significant
    digits."""
    if float(value).is_integer() and abs(value) >= 1:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def clock(seconds: float) -> str:
    """Seconds as H:MM:SS."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def memory_gib() -> float:
    """This process's memory in GiB (2^30 bytes): the peak allocated on the GPU under CUDA,
    else the resident set size (RSS) on the host."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**30
    import psutil

    return psutil.Process().memory_info().rss / 2**30
