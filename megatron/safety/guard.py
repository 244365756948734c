"""The loss and gradient guard: what a bad step does to the run.

    guard = StepGuard.from_args(args.training)
    verdict = guard.after_step(iteration, loss, skipped)   # .action: ok | warn | stop | rollback

A bad step is one whose loss is not finite, whose gradients held inf or NaN (`skipped`: the
optimizer did not apply it; DeepSpeed's overflow rule, which training.engine extends to the
plain torch optimizer), or, with `loss_spike_factor`, whose loss exceeds that factor times the
mean of the last `loss_spike_window` good losses. `bad_step_policy` says what follows:

- skip (default): the run goes on; a non-finite step was not applied. After `max_bad_steps`
  bad steps in a row the run stops (the weights no longer give a finite loss). A spike is only
  seen after its update, which skip cannot undo: it is reported and the run goes on.
- stop: the run stops at the first bad step.
- rollback: the newest good checkpoint is loaded and the batches since are skipped (the loop
  does it); after `max_rollbacks` rollbacks the run stops.

A step skipped by fp16's dynamic loss scaling (`overflow`: the scaled gradients left fp16's
range, DeepSpeed lowered the scale) is not bad: it is how the scaler finds its scale, and a run
starting at 2^32 (`initial_scale_power: 32`) skips a dozen or more in a row. The training log
counts them and shows the scale, as GPT-NeoX's does. Gradients that overflow at every scale
end the run at `fp16.min_loss_scale` (loop.py).

`healthy` is false while the last step was bad: the loop saves no checkpoint then.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

POLICIES = ("skip", "stop", "rollback")


class TrainingStopped(RuntimeError):
    """The guard stopped the run; the message says at which iteration and why. Workers exit
    with `exit_status`, which tells deepy.py not to restart the run (max_restarts)."""

    exit_status = 3


@dataclass(frozen=True)
class Verdict:
    """What the loop does after a step, and why (the iteration and the value)."""

    action: str  # ok | warn | stop | rollback
    message: str = ""


class StepGuard:
    """Decides, step by step, whether the run goes on (see the module docstring)."""

    def __init__(self, policy: str = "skip", spike_factor: float | None = None,
                 spike_window: int = 100, max_bad_steps: int = 10, max_rollbacks: int = 3):
        if policy not in POLICIES:
            raise ValueError(f"bad_step_policy {policy!r} is not known; valid: "
                             f"{', '.join(POLICIES)}")
        self.policy, self.spike_factor = policy, spike_factor
        self.max_bad_steps, self.max_rollbacks = max_bad_steps, max_rollbacks
        self.recent: deque[float] = deque(maxlen=spike_window)
        self.bad_in_row, self.rollbacks = 0, 0
        self.first_bad: int | None = None
        self.problem = ""  # why the last step was bad

    @classmethod
    def from_args(cls, training) -> "StepGuard":
        return cls(training.bad_step_policy, training.loss_spike_factor,
                   training.loss_spike_window, training.max_bad_steps, training.max_rollbacks)

    @property
    def healthy(self) -> bool:
        return self.bad_in_row == 0

    def after_step(self, iteration: int, loss: float, skipped: bool,
                   overflow: bool = False) -> Verdict:
        """The verdict on the step that just ended at `iteration`; `overflow`: it was skipped
        by fp16's dynamic loss scaling (neither good nor bad, unless its loss is not finite)."""
        if overflow and math.isfinite(loss):
            return Verdict("ok")
        why = self._why_bad(loss, skipped)
        spike = why is not None and math.isfinite(loss) and not skipped
        if why is None or (spike and self.policy == "skip"):
            self.recent.append(loss)
            self.bad_in_row, self.first_bad = 0, None
            return Verdict("ok") if why is None else Verdict(
                "warn", f"iteration {iteration}: {why}; its update was applied "
                "(bad_step_policy skip cannot undo a finite step)")
        self.bad_in_row += 1
        self.first_bad = self.first_bad or iteration
        message = self.problem = f"iteration {iteration}: {why}"
        if self.policy == "stop":
            return Verdict("stop", f"{message}; bad_step_policy is stop")
        if self.policy == "rollback":
            if self.rollbacks >= self.max_rollbacks:
                return Verdict("stop", f"{message}; {self.rollbacks} rollbacks (max_rollbacks) "
                                       "did not get past it")
            self.rollbacks += 1
            self.bad_in_row, self.first_bad = 0, None
            return Verdict("rollback", message)
        if self.bad_in_row >= self.max_bad_steps:
            return Verdict("stop", f"{message}; {self.bad_in_row} bad steps in a row since "
                                   f"iteration {self.first_bad} (max_bad_steps "
                                   f"{self.max_bad_steps}): the weights no longer give a finite "
                                   "loss. Lower the learning rate, or set bad_step_policy: "
                                   "rollback")
        return Verdict("warn", f"{message}; the update was not applied (bad_step_policy skip, "
                               f"{self.bad_in_row} of max_bad_steps {self.max_bad_steps} in a "
                               "row)")

    def _why_bad(self, loss: float, skipped: bool) -> str | None:
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        if skipped:
            return "the gradients hold inf or NaN"
        if self.spike_factor and len(self.recent) == self.recent.maxlen:
            mean = sum(self.recent) / len(self.recent)
            if mean > 0 and loss > self.spike_factor * mean:
                return (f"the loss {loss:.4f} is {loss / mean:.1f}x the mean {mean:.4f} of the "
                        f"last {len(self.recent)} steps (loss_spike_factor "
                        f"{self.spike_factor})")
        return None


def all_finite(tensors) -> bool:
    """Whether every element of `tensors` is finite: one fused pass (the largest magnitude of
    each tensor, which is inf or NaN exactly when the tensor holds one)."""
    import torch

    return bool(torch.stack(torch._foreach_norm(tensors, ord=float("inf"))).isfinite().all())


def weights_finite(engine) -> bool:
    """Whether every weight of every rank is finite (ZeRO 3: every partition). Collective."""
    import torch
    import torch.distributed as dist

    from megatron.checkpointing.optimizer_layouts import stored_tensor

    bad = torch.zeros(1)
    stored = [stored_tensor(p) for p in engine.engine.module.parameters()]
    stored = [t for t in stored if t.numel()]
    if stored and not all_finite(stored):
        bad += 1
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return not bad.item()
