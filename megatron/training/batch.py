"""From a loader batch {"text": [b, s+1]} to the model's inputs and the loss's targets, for the
plain language-model objective (A19). Every objective's version: megatron.training.objectives."""

from __future__ import annotations

from megatron.training.objectives.common import BatchOptions
from megatron.training.objectives.lm import LanguageModel

_LM = LanguageModel()


def check_batch_schema(batch: dict) -> None:
    """A19: the batch carries the keys the language-model objective reads."""
    _LM.check_batch(batch)


def model_inputs(batch: dict, options: BatchOptions):
    """((tokens, position_ids, mask), (labels, loss_mask)) for one micro-batch.

    `mask` is a [b, 1, s, s] keep-mask when reset_attention_mask is on, else a 1-element
    placeholder meaning plain causal attention (pipeline stages pass only tensors).
    """
    return _LM.prepare(batch, options)


__all__ = ["BatchOptions", "check_batch_schema", "model_inputs"]
