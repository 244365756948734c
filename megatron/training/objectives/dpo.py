"""`train_impl: dpo`: direct preference optimisation (Rafailov et al. 2023) on chosen/rejected
pairs, GPT-NeoX's formulation.

For pair k, with log p summed over its supervised tokens (not averaged) under the policy (pi)
and the frozen reference model (ref):

    logits_k = (pi_chosen - pi_rejected) - (ref_chosen - ref_rejected)
    loss     = mean over pairs of -log sigmoid(dpo_beta * logits_k)

The batch is the chosen rows followed by the rejected rows (twice the micro-batch through the
model). A sample of pack_until_overflow data holds several pairs, one per segment; each is its
own term (GPT-NeoX summed a whole row as one pair). `dpo_reference_free` takes the reference
log-probabilities as 0. Logged: `chosen_rewards` and `rejected_rewards` (dpo_beta * (pi - ref),
means), `margins` (their difference), `reward_acc` (share of pairs whose chosen reward is the
higher), `chosen_logps` / `rejected_logps` (policy sums) and `pairs` (a step's pairs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.training.objectives.base import Objective
from megatron.training.objectives.common import (BatchOptions, masked_mean, segment_sums, shift,
                                                 stack, token_logps)

PAIR_KEYS = frozenset({"pos", "pos_label", "pos_segment", "neg", "neg_label", "neg_segment"})


def pair_inputs(batch: dict, options: BatchOptions) -> tuple[tuple, tuple]:
    """Chosen rows then rejected rows: (inputs, (labels, loss_mask, segments))."""
    pos = shift(batch["pos"], options, batch["pos_label"], batch["pos_segment"])
    neg = shift(batch["neg"], options, batch["neg_label"], batch["neg_segment"])
    s = stack(pos, neg)
    return (s.tokens, s.position_ids, s.mask), (s.labels, s.loss_mask, s.segments)


def split_pairs(per_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen half and the rejected half of per-row values [2b, ...]."""
    half = per_row.shape[0] // 2
    return per_row[:half], per_row[half:]


class DPO(Objective):
    name = "dpo"
    loss_name = "dpo_loss"
    console_metrics = ("margins", "reward_acc")
    batch_keys = (PAIR_KEYS,)
    reference_slot = 3
    summed_metrics = frozenset({"pairs"})
    metric_names = ("chosen_rewards", "rejected_rewards", "margins", "reward_acc", "chosen_logps",
                    "rejected_logps", "pairs")

    def __init__(self, tp: TensorParallel = NO_TP, beta: float = 0.1, fp32: bool = True,
                 reference_free: bool = False):
        super().__init__(tp)
        self.beta, self.fp32, self.reference_free = beta, fp32, reference_free

    @classmethod
    def from_args(cls, args, tp: TensorParallel = NO_TP) -> "DPO":
        t = args.training
        return cls(tp, t.dpo_beta, t.dpo_fp32, t.dpo_reference_free)

    @property
    def needs_reference(self) -> bool:
        return not self.reference_free

    def prepare(self, batch: dict, options: BatchOptions) -> tuple[tuple, tuple]:
        self.check_batch(batch)
        inputs, (labels, loss_mask, segments) = pair_inputs(batch, options)
        return inputs, (labels, loss_mask, segments, torch.zeros_like(loss_mask))

    def loss(self, logits: torch.Tensor, targets: tuple) -> tuple[torch.Tensor, dict]:
        labels, loss_mask, segments, ref_logps = targets
        policy, present = segment_sums(token_logps(logits, labels, self.tp, self.fp32),
                                       loss_mask, segments)
        reference, _ = segment_sums(ref_logps.float(), loss_mask, segments)
        (pi_c, pi_r), (ref_c, ref_r) = split_pairs(policy), split_pairs(reference)
        valid = torch.logical_and(*split_pairs(present))
        loss, metrics = dpo_loss(pi_c, pi_r, ref_c, ref_r, self.beta, valid)
        return loss, metrics


def dpo_loss(pi_chosen: torch.Tensor, pi_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float, valid: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, dict]:
    """The DPO loss of pairs given their summed log-probabilities (any shape; `valid` marks the
    pairs that exist), and its metrics."""
    if valid is None:
        valid = torch.ones_like(pi_chosen, dtype=torch.bool)
    logits = (pi_chosen - pi_rejected) - (ref_chosen - ref_rejected)
    loss = masked_mean(-F.logsigmoid(beta * logits), valid)
    chosen_rewards = (beta * (pi_chosen - ref_chosen)).detach()
    rejected_rewards = (beta * (pi_rejected - ref_rejected)).detach()
    metrics = {
        "chosen_rewards": masked_mean(chosen_rewards, valid),
        "rejected_rewards": masked_mean(rejected_rewards, valid),
        "margins": masked_mean(chosen_rewards - rejected_rewards, valid),
        "reward_acc": masked_mean((chosen_rewards > rejected_rewards).float(), valid),
        "chosen_logps": masked_mean(pi_chosen.detach(), valid),
        "rejected_logps": masked_mean(pi_rejected.detach(), valid),
        "pairs": valid.float().sum(),
    }
    return loss, metrics
