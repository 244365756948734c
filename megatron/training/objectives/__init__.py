"""Training objectives (`train_impl`): what a batch must carry, the model's inputs and targets,
the loss and the metrics it logs. The step calls them and never branches on train_impl.

    objective = build_objective(args, tp)
    inputs, targets = objective.prepare(batch, BatchOptions(eod, ...))  # a loader batch
    loss, metrics = objective.loss(output, targets) # output: logits, or values for rm

    normal  next-token loss; with label files only where they keep it (SFT)     lm.py
    dpo     direct preference optimisation on chosen/rejected pairs             dpo.py
    kto     Kahneman-Tversky optimisation on documents with a reward            kto.py
    rm      reward model: a value head, Bradley-Terry loss on pairs             rm.py

`targets` is a tuple of tensors (what DeepSpeed's pipeline passes to the last stage's loss).
Objectives that compare with a reference model (dpo, kto) keep a slot in it for the reference
log-probabilities, filled in by megatron.training.reference before the step.
"""

from __future__ import annotations

from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.training.objectives.base import Objective
from megatron.training.objectives.common import BatchOptions
from megatron.training.objectives.dpo import DPO
from megatron.training.objectives.kto import KTO
from megatron.training.objectives.lm import LanguageModel
from megatron.training.objectives.rm import RewardModel

OBJECTIVES: dict[str, type[Objective]] = {
    "normal": LanguageModel, "dpo": DPO, "kto": KTO, "rm": RewardModel,
}


def build_objective(args, tp: TensorParallel = NO_TP) -> Objective:
    """The objective `train_impl` names, set up from the config."""
    return OBJECTIVES[args.training.train_impl].from_args(args, tp)


def batch_options(args, eod_token: int) -> BatchOptions:
    """How a batch's documents see each other and which tokens carry loss (data section)."""
    d = args.data
    return BatchOptions(eod_token, d.eod_mask_loss, d.reset_position_ids, d.reset_attention_mask)


__all__ = ["OBJECTIVES", "BatchOptions", "Objective", "batch_options", "build_objective"]
