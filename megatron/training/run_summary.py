"""The end of a training run in a few lines: what was trained, how fast, how well, and where
the model is; the same figures go to `<log_dir>/run_summary.json` beside metrics.jsonl.

    summary = RunSummary(args, start_iteration)
    summary.add_eval("validation", iteration, loss)     # each evaluation
    summary.finish(iteration, train_seconds, tflops, checkpoint)   # rank 0 prints and writes
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from megatron.monitoring.logger import print_rank_0
from megatron.training.finished import SUMMARY_FILE
from megatron.training.train_log import clock


class RunSummary:
    """Collects the evaluations of one run (one launch) and reports the run at its end."""

    def __init__(self, args, start_iteration: int):
        self._args = args
        self.start_iteration = start_iteration
        self._start = time.perf_counter()
        self._tokens_per_iter = args.derived.train_batch_size * args.model.seq_length
        self.evals: dict[str, list[tuple[int, float]]] = {"validation": [], "test": []}

    def add_eval(self, split: str, iteration: int, loss: float) -> None:
        self.evals[split].append((iteration, loss))

    def figures(self, iteration: int, train_seconds: float, tflops_per_gpu: float | None,
                checkpoint: str | None) -> dict:
        """The summary as a dict (the JSON file's content)."""
        iterations = iteration - self.start_iteration
        tokens = iterations * self._tokens_per_iter
        tokens_per_sec = tokens / train_seconds if train_seconds > 0 else None
        valid = [loss for _, loss in self.evals["validation"] if math.isfinite(loss)]
        figures = {
            "start_iteration": self.start_iteration, "end_iteration": iteration,
            "train_iters": self._args.training.train_iters, "iterations": iterations,
            "tokens": tokens, "seq_length": self._args.model.seq_length,
            "wall_seconds": time.perf_counter() - self._start,
            "train_seconds": train_seconds, "tokens_per_sec": tokens_per_sec,
            "final_val_loss": self.evals["validation"][-1][1] if self.evals["validation"] else None,
            "best_val_loss": min(valid) if valid else None,
            "test_loss": self.evals["test"][-1][1] if self.evals["test"] else None,
            "checkpoint": checkpoint,
        }
        peak = self._args.logging.peak_theoretical_tflops
        if tflops_per_gpu is not None:
            figures["model_tflops_per_gpu"] = tflops_per_gpu
            if peak:
                figures["mfu"] = 100 * tflops_per_gpu / peak
        return figures

    def finish(self, iteration: int, train_seconds: float, tflops_per_gpu: float | None,
               checkpoint: str | None, write: bool) -> dict:
        """Print the summary (rank 0) and, with `write`, save run_summary.json in log_dir."""
        f = self.figures(iteration, train_seconds, tflops_per_gpu, checkpoint)
        speed = (f"{f['tokens_per_sec']:,.0f} tokens/s" if f["tokens_per_sec"] else "no steps")
        if "mfu" in f:
            speed += f", MFU {f['mfu']:.2f}%"
        lines = [f"run finished at iteration {iteration}/{f['train_iters']}: {f['iterations']} "
                 f"iterations, {f['tokens']:,} tokens in {clock(f['wall_seconds'])} ({speed} "
                 f"while training)"]
        losses = []
        if f["final_val_loss"] is not None:
            losses.append(f"validation loss {f['final_val_loss']:.4f} (best "
                          f"{f['best_val_loss']:.4f})" if f["best_val_loss"] is not None else
                          f"validation loss {f['final_val_loss']}")
        if f["test_loss"] is not None:
            losses.append(f"test loss {f['test_loss']:.4f}")
        if losses:
            lines.append("  " + ", ".join(losses))
        lines.append(f"  checkpoint: {checkpoint}" if checkpoint else
                     "  no checkpoint (save is not set)")
        log_dir = self._args.logging.log_dir
        if write and log_dir:
            path = Path(log_dir) / SUMMARY_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(f, indent=1) + "\n")
            lines.append(f"  summary: {path}")
        print_rank_0("\n".join(lines))
        return f
