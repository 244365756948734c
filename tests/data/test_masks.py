"""Loss mask, position ids and document attention masks against a per-token loop."""

from __future__ import annotations

import torch

from megatron.data.masks import get_ltor_masks_and_position_ids

EOD = 0


def reference(row, reset_position_ids):
    """Megatron's loop: positions restart after each EOD; token t sees keys of its document."""
    s = len(row)
    pos, mask, start = [], torch.zeros(s, s, dtype=torch.bool), 0
    for t in range(s):
        pos.append(t - start if reset_position_ids else t)
        mask[t, start:t + 1] = True
        if row[t] == EOD:
            start = t + 1
    return pos, mask


def test_plain_causal_case_returns_no_mask():
    data = torch.tensor([[5, 0, 7, 8], [1, 2, 3, 4]])
    masks = get_ltor_masks_and_position_ids(data, EOD)
    assert masks.attention_mask is None
    assert masks.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert masks.loss_mask.dtype == torch.float32 and masks.loss_mask.sum() == 8
    loss_mask = get_ltor_masks_and_position_ids(data, EOD, eod_mask_loss=True).loss_mask
    assert loss_mask.tolist() == [[1, 0, 1, 1], [1, 1, 1, 1]]


def test_resets_match_the_reference():
    data = torch.tensor([[5, 0, 7, 8, 0, 0, 9, 3], [0, 1, 2, 3, 4, 0, 6, 7],
                         [1, 2, 3, 4, 5, 6, 7, 8]])
    masks = get_ltor_masks_and_position_ids(data, EOD, reset_position_ids=True,
                                            reset_attention_mask=True)
    assert masks.attention_mask.shape == (3, 1, 8, 8)
    assert masks.position_ids.dtype == torch.long
    for b in range(3):
        pos, mask = reference(data[b].tolist(), True)
        assert masks.position_ids[b].tolist() == pos
        assert torch.equal(masks.attention_mask[b, 0], mask)
    only_positions = get_ltor_masks_and_position_ids(data, EOD, reset_position_ids=True)
    assert only_positions.attention_mask is None
    assert torch.equal(only_positions.position_ids, masks.position_ids)
