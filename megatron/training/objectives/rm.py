"""`train_impl: rm`: a reward model. The LM head is replaced by a value head (a linear map of
the final hidden state to one number, megatron.model.value_head) and pairs are scored where
each response ends: the value at the last position of each document whose target carries loss.
With data from `preprocess_data_with_chat_template.py --for-rm` (the conversation, then two
EOS tokens, only the second a label) that is the first EOS, after the whole conversation, as in
GPT-NeoX. The Bradley-Terry loss with GPT-NeoX's z-loss:

    loss = mean over pairs of -log sigmoid(v_chosen - v_rejected)
           + z_loss * mean over pairs of (v_chosen^2 + v_rejected^2)

Logged: `pos_values`, `neg_values` (means), `margin` (mean v_chosen - v_rejected), `accuracy`
(share of pairs with v_chosen > v_rejected) and `pairs`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.training.objectives.base import Objective
from megatron.training.objectives.common import BatchOptions, last_in_segment, masked_mean
from megatron.training.objectives.dpo import PAIR_KEYS, pair_inputs, split_pairs


class RewardModel(Objective):
    name = "rm"
    loss_name = "rm_loss"
    console_metrics = ("margin", "accuracy")
    batch_keys = (PAIR_KEYS,)
    output = "values"
    summed_metrics = frozenset({"pairs"})
    metric_names = ("pos_values", "neg_values", "margin", "accuracy", "pairs")

    def __init__(self, tp: TensorParallel = NO_TP, z_loss: float = 0.0):
        super().__init__(tp)
        self.z_loss = z_loss

    @classmethod
    def from_args(cls, args, tp: TensorParallel = NO_TP) -> "RewardModel":
        return cls(tp, args.training.z_loss)

    def prepare(self, batch: dict, options: BatchOptions) -> tuple[tuple, tuple]:
        self.check_batch(batch)
        return pair_inputs(batch, options)

    def loss(self, values: torch.Tensor, targets: tuple) -> tuple[torch.Tensor, dict]:
        _labels, loss_mask, segments = targets[:3]
        if values.dim() == 3:
            values = values.squeeze(-1)
        picked, present = last_in_segment(values.float(), loss_mask, segments)
        chosen, rejected = split_pairs(picked)
        valid = torch.logical_and(*split_pairs(present))
        return reward_model_loss(chosen, rejected, self.z_loss, valid)


def reward_model_loss(chosen: torch.Tensor, rejected: torch.Tensor, z_loss: float = 0.0,
                      valid: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The Bradley-Terry loss (+ z-loss) of pairs given their values, and its metrics."""
    if valid is None:
        valid = torch.ones_like(chosen, dtype=torch.bool)
    loss = masked_mean(-F.logsigmoid(chosen - rejected), valid)
    if z_loss:
        loss = loss + z_loss * masked_mean(chosen ** 2 + rejected ** 2, valid)
    c, r = chosen.detach(), rejected.detach()
    return loss, {"pos_values": masked_mean(c, valid), "neg_values": masked_mean(r, valid),
                  "margin": masked_mean(c - r, valid),
                  "accuracy": masked_mean((c > r).float(), valid), "pairs": valid.float().sum()}
