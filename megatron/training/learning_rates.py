"""The learning-rate schedule: linear warmup, then constant / linear / cosine decay to min_lr.

`learning_rate` is a pure function of the iteration; `AnnealingLR` applies it to an optimizer and
is what DeepSpeed steps (once per optimizer step, skipped on fp16 overflow) and checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DECAY_STYLES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class Schedule:
    """The schedule's constants: peak lr, floor, and where warmup and decay end."""

    lr: float
    min_lr: float
    warmup_iters: int
    decay_iters: int
    style: str

    def __post_init__(self) -> None:
        if self.style not in DECAY_STYLES:
            raise ValueError(f"lr_decay_style {self.style!r} is not known; valid: {', '.join(DECAY_STYLES)}")


def learning_rate(iteration: int, s: Schedule) -> float:
    """The lr for the optimizer step taken after `iteration` completed steps."""
    if s.warmup_iters > 0 and iteration < s.warmup_iters:
        return s.lr * (iteration + 1) / s.warmup_iters
    if s.style == "constant":
        return s.lr
    span = max(s.decay_iters - s.warmup_iters, 1)
    progress = min(max(iteration - s.warmup_iters, 0) / span, 1.0)
    if s.style == "linear":
        factor = 1.0 - progress
    else:
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    return s.min_lr + (s.lr - s.min_lr) * factor


class AnnealingLR:
    """Sets each param group's lr from `learning_rate`; state is the number of steps taken."""

    def __init__(self, optimizer, schedule: Schedule, start_iteration: int = 0):
        self.optimizer = optimizer
        self.schedule = schedule
        self.num_steps = start_iteration
        self._apply()

    def _apply(self) -> None:
        lr = learning_rate(self.num_steps, self.schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def step(self, increment: int = 1) -> None:
        self.num_steps += increment
        self._apply()

    def state_dict(self) -> dict:
        return {"num_steps": self.num_steps, "schedule": self.schedule.__dict__.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.num_steps = int(state["num_steps"])
        self._apply()
