"""From a loader batch {"text": [b, s+1]} to the model's inputs and the loss's targets (A19)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron.data.masks import get_ltor_masks_and_position_ids

EXPECTED_KEYS = frozenset({"text"})


@dataclass(frozen=True)
class BatchOptions:
    """How documents inside one sample see each other, and which tokens carry loss."""

    eod_token: int
    eod_mask_loss: bool = False
    reset_position_ids: bool = False
    reset_attention_mask: bool = False


def check_batch_schema(batch: dict) -> None:
    """A19: the batch carries exactly the keys the model expects."""
    keys = set(batch)
    if keys != EXPECTED_KEYS:
        missing, extra = sorted(EXPECTED_KEYS - keys), sorted(keys - EXPECTED_KEYS)
        raise ValueError(f"training batch keys {sorted(keys)} do not match the model's "
                         f"{sorted(EXPECTED_KEYS)} (missing: {missing}, unexpected: {extra})")


def model_inputs(batch: dict, options: BatchOptions):
    """((tokens, position_ids, mask), (labels, loss_mask)) for one micro-batch.

    `mask` is a [b, 1, s, s] keep-mask when reset_attention_mask is on, else a 1-element
    placeholder meaning plain causal attention (pipeline stages pass only tensors).
    """
    check_batch_schema(batch)
    text = batch["text"].long()  # [b, s+1]
    tokens, labels = text[:, :-1].contiguous(), text[:, 1:].contiguous()  # [b, s]
    masks = get_ltor_masks_and_position_ids(
        tokens, options.eod_token, eod_mask_loss=options.eod_mask_loss,
        reset_position_ids=options.reset_position_ids,
        reset_attention_mask=options.reset_attention_mask)
    mask = masks.attention_mask
    if mask is None:
        mask = torch.zeros(1, dtype=torch.bool)
    return (tokens, masks.position_ids, mask), (labels, masks.loss_mask)
