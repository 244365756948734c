"""`train_impl: normal`: the next-token loss, averaged over the positions that carry it.

Without label files every position does (pretraining; `eod_mask_loss` drops end-of-document
inputs). With label files (supervised fine-tuning) only the positions whose label is a token
id do: the assistant turns of a chat, the completion of a prompt. The loss of a micro-batch is
sum(CE * mask) / sum(mask) over its supervised positions, as GPT-NeoX computes it; the step
averages micro-batches and data-parallel ranks. `supervised_tokens` counts a step's
supervised positions.
"""

from __future__ import annotations

import torch

from megatron.model.fusions import cross_entropy
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.training.objectives.base import Objective
from megatron.training.objectives.common import BatchOptions, shift


class LanguageModel(Objective):
    name = "normal"
    batch_keys = (frozenset({"text"}), frozenset({"text", "label"}),
                  frozenset({"text", "label", "segment"}))
    summed_metrics = frozenset({"supervised_tokens"})

    def __init__(self, tp: TensorParallel = NO_TP, supervised: bool = False):
        super().__init__(tp)
        # with label files (or padded samples) only some positions carry loss: count them
        self.metric_names = ("supervised_tokens",) if supervised else ()
        self.console_metrics = self.metric_names

    @classmethod
    def from_args(cls, args, tp: TensorParallel = NO_TP) -> "LanguageModel":
        d = args.data
        labelled = any(getattr(d, f"{s}_label_data_paths") for s in ("train", "valid", "test"))
        return cls(tp, supervised=labelled or d.pack_impl != "packed")

    def prepare(self, batch: dict, options: BatchOptions) -> tuple[tuple, tuple]:
        self.check_batch(batch)
        s = shift(batch["text"], options, batch.get("label"), batch.get("segment"))
        return (s.tokens, s.position_ids, s.mask), (s.labels, s.loss_mask)

    def loss(self, logits: torch.Tensor, targets: tuple) -> tuple[torch.Tensor, dict]:
        labels, loss_mask = targets[:2]
        losses = cross_entropy(logits, labels, self.tp)  # [b, s]
        mask = loss_mask.float()
        supervised = mask.sum()
        loss = (losses * mask).sum() / supervised.clamp(min=1.0)
        return loss, ({"supervised_tokens": supervised.detach()} if self.metric_names else {})
