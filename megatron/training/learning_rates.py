"""The learning-rate schedule, equal to GPT-NeoX's `AnnealingLR` at every iteration.

`learning_rate(n, schedule)` is the lr of the optimizer step taken after n completed steps:

    warmup (n <= W, W > 0):  lr * max(1, n) / W            (steps 0 and 1 both use lr / W)
    then, with m = n - W and E = decay_iters - W:
      constant               lr
      linear                 lr * (E - m) / E
      cosine                 min_lr + (lr - min_lr) / 2 * (cos(pi * m / E) + 1)
      exponential            lr * exp(-0.693 * m / E)      (halves over the decay)
    and never below min_lr.

W = warmup * decay_iters is not rounded (GPT-NeoX keeps the fraction), and decay_iters is
lr_decay_iters, else floor(train_iters * lr_decay_fraction), else train_iters
(neox_arguments.derived). Past decay_iters, linear stays at min_lr and cosine follows the
cosine back up, as GPT-NeoX's does. One deliberate difference: where E <= 0 (warmup: 1.0) GPT-NeoX
divides by zero after the warmup; here the decaying styles hold min_lr.

`AnnealingLR` applies it to an optimizer and is what DeepSpeed steps (once per optimizer step,
skipped on fp16 overflow) and checkpoints. Its state uses GPT-NeoX's keys, and loading one
follows GPT-NeoX's rules: the checkpoint's schedule must equal the config's unless
`use_checkpoint_lr_scheduler` (take the checkpoint's) or `override_lr_scheduler` (take the
config's) says which wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DECAY_STYLES = ("constant", "linear", "cosine", "exponential")


@dataclass(frozen=True)
class Schedule:
    """The schedule's constants: peak lr, floor, and where warmup and decay end."""

    lr: float
    min_lr: float
    warmup_iters: float
    decay_iters: int
    style: str

    def __post_init__(self) -> None:
        if self.style not in DECAY_STYLES:
            raise ValueError(f"lr_decay_style {self.style!r} is not known; valid: "
                             f"{', '.join(DECAY_STYLES)}")


def lr_schedule(args) -> Schedule:
    """The schedule of the run config `args` (decay and warmup lengths from args.derived)."""
    return Schedule(lr=args.optimizer.lr, min_lr=args.lr_schedule.min_lr,
                    warmup_iters=args.derived.warmup_iters, decay_iters=args.derived.lr_decay_iters,
                    style=args.lr_schedule.lr_decay_style)


def learning_rate(iteration: int, s: Schedule) -> float:
    """The lr for the optimizer step taken after `iteration` completed steps."""
    if s.warmup_iters > 0 and iteration <= s.warmup_iters:
        return float(s.lr) * max(1, iteration) / s.warmup_iters
    if s.style == "constant":
        return max(s.lr, s.min_lr)
    done, span = iteration - s.warmup_iters, s.decay_iters - s.warmup_iters
    if span <= 0:
        return s.min_lr
    if s.style == "linear":
        lr = s.lr * (span - done) / span
    elif s.style == "cosine":
        lr = s.min_lr + (s.lr - s.min_lr) / 2.0 * (math.cos(math.pi * done / span) + 1)
    else:
        lr = s.lr * math.exp(-0.693 * done / span)
    return max(lr, s.min_lr)


# our Schedule field -> (GPT-NeoX's state-dict key, what it is called in a message)
_STATE_KEYS = {"lr": ("start_lr", "learning rate (lr)"), "min_lr": ("min_lr", "min_lr"),
               "warmup_iters": ("warmup_iter", "warmup iterations (warmup x decay iterations)"),
               "decay_iters": ("end_iter", "decay iterations (lr_decay_iters / train_iters)"),
               "style": ("decay_style", "lr_decay_style")}


class AnnealingLR:
    """Sets each param group's lr from `learning_rate`; state is the number of steps taken and
    the schedule's constants (GPT-NeoX's keys)."""

    def __init__(self, optimizer, schedule: Schedule, start_iteration: int = 0,
                 use_checkpoint: bool = False, override: bool = False):
        if use_checkpoint and override:
            raise ValueError("use_checkpoint_lr_scheduler and override_lr_scheduler are both "
                             "set; choose one: the checkpoint's schedule or the config's")
        self.optimizer = optimizer
        self.schedule = schedule
        self.num_steps = start_iteration
        self.use_checkpoint, self.override = use_checkpoint, override
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
        state = {key: getattr(self.schedule, field) for field, (key, _) in _STATE_KEYS.items()}
        return {**state, "num_iters": self.num_steps}

    def load_state_dict(self, state: dict) -> None:
        """The step count from `state`; the schedule as use_checkpoint / override say (a
        difference with neither set is refused, naming every value). Reads GPT-NeoX's
        scheduler state and this framework's earlier form ({"num_steps", "schedule"})."""
        saved = _saved_schedule(state)
        if not self.override:
            check_resumable(saved, self.schedule, self.use_checkpoint, self.override)
            self.schedule = saved
        self.num_steps = int(state.get("num_iters", state.get("num_steps", 0)))
        self._apply()


def check_resumable(saved: Schedule, config: Schedule, use_checkpoint: bool,
                    override: bool) -> None:
    """GPT-NeoX's rule for resuming: a schedule that differs from the checkpoint's needs
    override_lr_scheduler (the config's wins) or use_checkpoint_lr_scheduler (the
    checkpoint's wins); ValueError naming every difference otherwise."""
    differs = [f"{name}: checkpoint {getattr(saved, field)!r}, config {getattr(config, field)!r}"
               for field, (_, name) in _STATE_KEYS.items()
               if getattr(saved, field) != getattr(config, field)]
    if differs and not (use_checkpoint or override):
        raise ValueError(
            "the checkpoint's learning-rate schedule differs from the config's ("
            + "; ".join(differs) + "). Set override_lr_scheduler: true to use the config's, or "
            "use_checkpoint_lr_scheduler: true to keep the checkpoint's")


def _saved_schedule(state: dict) -> Schedule:
    if "schedule" in state:  # this framework's earlier form
        return Schedule(**state["schedule"])
    return Schedule(**{field: state[key] for field, (key, _) in _STATE_KEYS.items()})
