"""`train_impl: kto`: Kahneman-Tversky optimisation (Ethayarajh et al. 2024) on documents that
each carry a reward: above 0 desirable, below 0 undesirable, 0 left out.

With r = log p(policy) - log p(reference) summed over a document's supervised tokens and the
reference point z = the mean of r over the micro-batch's documents (detached, at least 0):

    desirable:    kto_desirable_weight   * (1 - sigmoid(kto_beta * (r - z)))
    undesirable:  kto_undesirable_weight * (1 - sigmoid(kto_beta * (z - r)))
    loss = mean over the documents

the loss of the KTO paper's equation 7 as TRL computes it, with the reference point taken from
the micro-batch's own documents rather than from mismatched prompt/response pairs (GPT-NeoX
takes it from the other half of the batch; docs/gpt-neox.md). A document's reward is read from
the reward file (one per document). Logged: `kto_kl` (z), `chosen_rewards` /
`rejected_rewards` (kto_beta * r, means over desirable / undesirable documents) and their
counts per step `desirable` / `undesirable`.
"""

from __future__ import annotations

import torch

from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.training.objectives.base import Objective
from megatron.training.objectives.common import (BatchOptions, last_in_segment, masked_mean,
                                                 segment_sums, shift, token_logps)


class KTO(Objective):
    name = "kto"
    loss_name = "kto_loss"
    console_metrics = ("kto_kl", "chosen_rewards", "rejected_rewards")
    batch_keys = (frozenset({"text", "label", "segment", "reward"}),)
    reference_slot = 3
    summed_metrics = frozenset({"desirable", "undesirable"})
    metric_names = ("kto_kl", "chosen_rewards", "rejected_rewards", "desirable", "undesirable")

    def __init__(self, tp: TensorParallel = NO_TP, beta: float = 0.1, fp32: bool = True,
                 desirable_weight: float = 1.0, undesirable_weight: float = 1.0):
        super().__init__(tp)
        self.beta, self.fp32 = beta, fp32
        self.weights = (desirable_weight, undesirable_weight)

    @classmethod
    def from_args(cls, args, tp: TensorParallel = NO_TP) -> "KTO":
        t = args.training
        return cls(tp, t.kto_beta, t.kto_fp32, t.kto_desirable_weight, t.kto_undesirable_weight)

    def prepare(self, batch: dict, options: BatchOptions) -> tuple[tuple, tuple]:
        self.check_batch(batch)
        s = shift(batch["text"], options, batch["label"], batch["segment"])
        reward = batch["reward"][:, 1:].float().contiguous()  # the reward of each target's document
        return ((s.tokens, s.position_ids, s.mask),
                (s.labels, s.loss_mask, s.segments, torch.zeros_like(s.loss_mask), reward))

    def loss(self, logits: torch.Tensor, targets: tuple) -> tuple[torch.Tensor, dict]:
        labels, loss_mask, segments, ref_logps, reward = targets
        policy, present = segment_sums(token_logps(logits, labels, self.tp, self.fp32),
                                       loss_mask, segments)
        reference, _ = segment_sums(ref_logps.float(), loss_mask, segments)
        rewards, _ = last_in_segment(reward, loss_mask, segments)
        return kto_loss(policy - reference, rewards, present, self.beta, *self.weights)


def kto_loss(logratios: torch.Tensor, rewards: torch.Tensor, present: torch.Tensor, beta: float,
             desirable_weight: float = 1.0, undesirable_weight: float = 1.0
             ) -> tuple[torch.Tensor, dict]:
    """The KTO loss of documents given their log-ratios and rewards (any shape; `present` marks
    the documents that exist), and its metrics."""
    desirable, undesirable = present & (rewards > 0), present & (rewards < 0)
    z = masked_mean(logratios.detach(), desirable | undesirable).clamp(min=0)
    chosen = desirable_weight * (1 - torch.sigmoid(beta * (logratios - z)))
    rejected = undesirable_weight * (1 - torch.sigmoid(beta * (z - logratios)))
    per_document = torch.where(desirable, chosen, torch.where(undesirable, rejected,
                                                              torch.zeros_like(chosen)))
    loss = masked_mean(per_document, desirable | undesirable)
    rewards_now = (beta * logratios).detach()
    return loss, {"kto_kl": z, "chosen_rewards": masked_mean(rewards_now, desirable),
                  "rejected_rewards": masked_mean(rewards_now, undesirable),
                  "desirable": desirable.float().sum(), "undesirable": undesirable.float().sum()}
