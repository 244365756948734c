"""The interface every training objective implements (see the package docstring)."""

from __future__ import annotations

import torch

from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.training.objectives.common import BatchOptions


class Objective:
    """One training objective. Subclasses set the class attributes and the three methods."""

    name = ""
    batch_keys: tuple[frozenset, ...] = ()  # the key sets a loader batch may carry (A19)
    reference_slot: int | None = None  # index in targets of the reference log-probabilities
    output = "logits"  # what the model's last layer gives: "logits", or "values" (rm)
    summed_metrics: frozenset = frozenset()  # summed over a step's micro-batches, not averaged

    metric_names: tuple[str, ...] = ()  # every metric `loss` returns, in a fixed order
    console_metrics: tuple[str, ...] = ()  # the few of them the console line shows
    loss_name = "lm_loss"  # the console's name of the loss (trackers keep GPT-NeoX's lm_loss)

    def __init__(self, tp: TensorParallel = NO_TP):
        self.tp = tp

    @classmethod
    def from_args(cls, args, tp: TensorParallel = NO_TP) -> "Objective":
        return cls(tp)

    @property
    def needs_reference(self) -> bool:
        """Whether a frozen reference model scores every batch (filling `reference_slot`)."""
        return self.reference_slot is not None

    def check_batch(self, batch: dict) -> None:
        """A19: the batch carries one of the key sets this objective reads."""
        keys = frozenset(batch)
        if keys in self.batch_keys:
            return
        closest = min(self.batch_keys, key=lambda k: len(k ^ keys))
        expected = " or ".join(str(sorted(k)) for k in self.batch_keys)
        raise ValueError(f"batch keys {sorted(keys)} do not match what train_impl "
                         f"{self.name} reads: {expected} (missing: {sorted(closest - keys)}, "
                         f"unexpected: {sorted(keys - closest)})")

    def prepare(self, batch: dict, options: BatchOptions) -> tuple[tuple, tuple]:
        """((tokens, position_ids, mask), targets) of one micro-batch."""
        raise NotImplementedError

    def loss(self, output: torch.Tensor, targets: tuple) -> tuple[torch.Tensor, dict]:
        """(scalar loss, {metric name: scalar tensor}) of one micro-batch."""
        raise NotImplementedError

    def with_reference(self, targets: tuple, ref_logps: torch.Tensor) -> tuple:
        """`targets` with the reference log-probabilities [b, s] in their slot."""
        i = self.reference_slot
        return targets[:i] + (ref_logps.detach().float(),) + targets[i + 1:]
