"""What every objective shares: from a loader batch's token and label streams to the model's
inputs and the targets, per-token log-probabilities, and sums over each document of a sample.

Streams have seq_length + 1 entries (megatron.data): the model reads positions 0..s-1 and
position t is scored on the label at t + 1. A label below 0 (-100) carries no loss; without a
label stream every token is a label. `segment` numbers a sample's documents (-1 on padding);
the document of a target is the segment of its label position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from megatron.data.masks import get_ltor_masks_and_position_ids, segment_position_ids_and_mask
from megatron.model.fusions import cross_entropy
from megatron.mpu.groups import NO_TP, TensorParallel


@dataclass(frozen=True)
class BatchOptions:
    """How documents inside one sample see each other, and which tokens carry loss."""

    eod_token: int
    eod_mask_loss: bool = False
    reset_position_ids: bool = False
    reset_attention_mask: bool = False


class Shifted(NamedTuple):
    """One token stream made into model inputs and targets."""

    tokens: torch.Tensor  # [b, s] int64 inputs
    position_ids: torch.Tensor  # [b, s]
    mask: torch.Tensor  # [b, 1, s, s] bool keep-mask, or a 1-element placeholder (causal)
    labels: torch.Tensor  # [b, s] int64 targets (0 where they carry no loss)
    loss_mask: torch.Tensor  # [b, s] float32
    segments: torch.Tensor  # [b, s] int64 document of each target (-1: padding / none)


def shift(text: torch.Tensor, options: BatchOptions, label: torch.Tensor | None = None,
          segment: torch.Tensor | None = None) -> Shifted:
    """Inputs and targets of a token stream `text` [b, s+1] with its label and segment streams."""
    text = text.long()
    tokens = text[:, :-1].contiguous()
    target = (label if label is not None else text)[:, 1:].long()
    carries = target >= 0
    labels = torch.where(carries, target, torch.zeros_like(target)).contiguous()
    if segment is None:
        masks = get_ltor_masks_and_position_ids(
            tokens, options.eod_token, eod_mask_loss=options.eod_mask_loss,
            reset_position_ids=options.reset_position_ids,
            reset_attention_mask=options.reset_attention_mask)
        position_ids, mask, loss_mask = masks.position_ids, masks.attention_mask, masks.loss_mask
        segments = torch.zeros_like(labels)
    else:
        segment = segment.long()
        position_ids, mask = segment_position_ids_and_mask(
            segment[:, :-1], options.reset_position_ids, options.reset_attention_mask)
        loss_mask = torch.ones(labels.shape, dtype=torch.float32)
        if options.eod_mask_loss:
            loss_mask[tokens == options.eod_token] = 0.0
        segments = segment[:, 1:].contiguous()
    loss_mask = loss_mask * carries.float()
    if mask is None:
        mask = torch.zeros(1, dtype=torch.bool)
    return Shifted(tokens, position_ids, mask, labels, loss_mask, segments)


def stack(first: Shifted, second: Shifted) -> Shifted:
    """Two halves of a batch (chosen, rejected) as one batch of twice the rows."""
    mask = first.mask
    if mask.dim() == 4:
        mask = torch.cat([first.mask, second.mask])
    return Shifted(*(torch.cat([a, b]) if name != "mask" else mask
                     for name, a, b in zip(Shifted._fields, first, second)))


def token_logps(logits: torch.Tensor, labels: torch.Tensor, tp: TensorParallel = NO_TP,
                fp32: bool = True) -> torch.Tensor:
    """log p(label) at every position [b, s], exact over the full vocabulary (the logits may be
    this rank's vocabulary slice)."""
    return -cross_entropy(logits, labels, tp, fp32=fp32).float()


def segment_sums(values: torch.Tensor, weights: torch.Tensor, segments: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums [b, k], present [b, k]) of values * weights over each segment 0..k-1 of each row,
    k = the most segments a row has; `present`: the segment has a target with weight > 0."""
    k = int(segments.max().item()) + 1 if segments.numel() else 0
    k = max(k, 1)
    index = segments.clamp(min=-1) + 1  # slot 0 collects padding
    sums = torch.zeros(values.shape[0], k + 1, dtype=values.dtype, device=values.device)
    sums = sums.scatter_add(1, index, values * weights)
    count = torch.zeros(values.shape[0], k + 1, dtype=weights.dtype, device=values.device)
    count = count.scatter_add(1, index, (weights > 0).to(weights.dtype))
    return sums[:, 1:], count[:, 1:] > 0


def last_in_segment(values: torch.Tensor, weights: torch.Tensor, segments: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [b, k] at the last position of each segment with weight > 0, present [b, k])."""
    b, s = values.shape
    k = max(int(segments.max().item()) + 1 if segments.numel() else 0, 1)
    position = torch.arange(1, s + 1, device=values.device).expand(b, s)
    candidate = torch.where(weights > 0, position, torch.zeros_like(position))
    index = torch.where(weights > 0, segments + 1, torch.zeros_like(segments))
    last = torch.zeros(b, k + 1, dtype=position.dtype, device=values.device)
    last = last.scatter_reduce(1, index, candidate, reduce="amax")[:, 1:]  # [b, k], 0: none
    present = last > 0
    picked = values.gather(1, (last - 1).clamp(min=0))
    return picked, present


def masked_mean(values: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `present` (0 when nothing is present)."""
    present = present.to(values.dtype)
    return (values * present).sum() / present.sum().clamp(min=1.0)
