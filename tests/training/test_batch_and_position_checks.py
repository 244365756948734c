"""A19 and A18's resume-time agreement, provoked: a batch with the wrong keys, and two gloo
ranks that would resume at different data positions."""

from __future__ import annotations

import pytest
import torch

from megatron.training.batch import check_batch_schema
from tests.distributed import run_distributed


def test_a_batch_with_other_keys_is_refused_naming_them():
    check_batch_schema({"text": torch.zeros(2, 5, dtype=torch.long)})
    with pytest.raises(ValueError) as err:
        check_batch_schema({"input_ids": torch.zeros(2, 5), "labels": torch.zeros(2, 5)})
    assert str(err.value) == (
        "batch keys ['input_ids', 'labels'] do not match what train_impl normal reads: "
        "['text'] or ['label', 'text'] or ['label', 'segment', 'text'] (missing: ['text'], "
        "unexpected: ['input_ids', 'labels'])")


def _resume_at(rank, world):
    from megatron.training.loop import RunState, check_ranks_agree

    state = RunState(iteration=10, consumed_train_samples=160 + 16 * rank,
                     consumed_valid_samples=32)
    try:
        check_ranks_agree(state)
    except RuntimeError as err:
        return str(err)
    return None


def test_ranks_resuming_at_different_positions_all_stop():
    messages = run_distributed(_resume_at, 2)
    assert all(messages), messages
    assert messages[1].startswith("ranks disagree on where to resume (iteration, consumed train "
                                  "samples, consumed valid samples): rank 1 has [10, 176, 32], "
                                  "the range over ranks is [10, 160, 32]..[10, 176, 32]")
    assert "load an earlier checkpoint" in messages[0]
