"""Loss mask, position ids and per-document attention mask for a left-to-right LM batch.

Vectorised over the batch: an EOD token closes its document, so position t belongs to document
number (EODs strictly before t). With `reset_position_ids`, positions count from 0 again after
every EOD; with `reset_attention_mask`, a token attends only to earlier tokens of its own
document. The mask follows torch's `scaled_dot_product_attention` convention: True = may attend.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class LtorMasks(NamedTuple):
    loss_mask: torch.Tensor  # [b, s] float32, 0 where the input token is EOD and eod_mask_loss
    position_ids: torch.Tensor  # [b, s] int64
    attention_mask: torch.Tensor | None  # [b, 1, s, s] bool, True = may attend; None = causal


def get_ltor_masks_and_position_ids(data: torch.Tensor, eod_token: int,
                                    eod_mask_loss: bool = False,
                                    reset_position_ids: bool = False,
                                    reset_attention_mask: bool = False) -> LtorMasks:
    """Masks for input tokens `data` [b, s].

    `attention_mask` is None unless `reset_attention_mask`: the model then applies the plain
    causal mask itself.
    """
    if data.dim() != 2:
        raise ValueError(f"data must be [batch, seq], got shape {tuple(data.shape)}")
    b, s = data.shape
    is_eod = data == eod_token  # [b, s]
    loss_mask = torch.ones(b, s, dtype=torch.float32, device=data.device)
    if eod_mask_loss:
        loss_mask[is_eod] = 0.0
    arange = torch.arange(s, device=data.device)
    if reset_position_ids:
        # start of t's document: one past the last EOD strictly before t (0 if none)
        after_eod = torch.where(is_eod, arange + 1, torch.zeros_like(arange))  # [b, s]
        starts = torch.cummax(after_eod, dim=1).values  # last EOD at or before t, plus 1
        starts = torch.cat([torch.zeros(b, 1, dtype=starts.dtype, device=data.device),
                            starts[:, :-1]], dim=1)  # shift: EOD belongs to its own document
        position_ids = arange.unsqueeze(0) - starts
    else:
        position_ids = arange.unsqueeze(0).expand(b, s).clone()
    attention_mask = None
    if reset_attention_mask:
        doc = torch.cumsum(is_eod.long(), dim=1) - is_eod.long()  # [b, s] EODs before t
        same_doc = doc.unsqueeze(2) == doc.unsqueeze(1)  # [b, s, s] (query, key)
        causal = torch.ones(s, s, dtype=torch.bool, device=data.device).tril()
        attention_mask = (same_doc & causal).unsqueeze(1)  # [b, 1, s, s]
    return LtorMasks(loss_mask, position_ids.long(), attention_mask)


def segment_position_ids_and_mask(segments: torch.Tensor, reset_position_ids: bool = False,
                                  reset_attention_mask: bool = False
                                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(position_ids [b, s], attention mask [b, 1, s, s] or None) for inputs whose documents are
    numbered by `segments` [b, s] (0, 1, ... per sample, -1 on padding), as samples of whole
    documents give them: the same resets as above, at the documents' known boundaries instead of
    at EOD tokens."""
    b, s = segments.shape
    arange = torch.arange(s, device=segments.device)
    if reset_position_ids:
        new = torch.ones_like(segments, dtype=torch.bool)
        new[:, 1:] = segments[:, 1:] != segments[:, :-1]
        starts = torch.cummax(torch.where(new, arange, torch.zeros_like(arange)), dim=1).values
        position_ids = arange.unsqueeze(0) - starts
    else:
        position_ids = arange.unsqueeze(0).expand(b, s).clone()
    mask = None
    if reset_attention_mask:
        same = segments.unsqueeze(2) == segments.unsqueeze(1)  # [b, s, s] (query, key)
        causal = torch.ones(s, s, dtype=torch.bool, device=segments.device).tril()
        mask = (same & causal).unsqueeze(1)
    return position_ids.long(), mask
