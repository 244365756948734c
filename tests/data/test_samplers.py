"""PretrainingSampler: disjoint ranks, exact restart, bounds (A18)."""

from __future__ import annotations

import pytest

from megatron.data.samplers import PretrainingSampler


def batches(total, consumed, mbs, rank, dp, drop_last=True):
    return list(PretrainingSampler(total, consumed, mbs, rank, dp, drop_last=drop_last))


def test_ranks_get_disjoint_samples_covering_the_data():
    rank0, rank1 = batches(50, 0, 4, 0, 2), batches(50, 0, 4, 1, 2)
    assert rank0[:2] == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert rank1[:2] == [[4, 5, 6, 7], [12, 13, 14, 15]]
    seen0 = {i for b in rank0 for i in b}
    seen1 = {i for b in rank1 for i in b}
    assert not seen0 & seen1
    assert seen0 | seen1 == set(range(48))  # the last 2 samples do not fill a global batch
    assert len(PretrainingSampler(50, 0, 4, 0, 2)) == len(rank0) == 6


def test_restart_from_consumed_samples_continues_exactly():
    full = batches(100, 0, 3, 1, 2)
    for steps in (0, 1, 5, 10):
        consumed = steps * 3 * 2
        assert batches(100, consumed, 3, 1, 2) == full[steps:]


def test_partial_last_batch_without_drop_last():
    assert batches(10, 0, 4, 0, 2, drop_last=False) == [[0, 1, 2, 3], [8, 9]]
    assert batches(10, 0, 4, 1, 2, drop_last=False) == [[4, 5, 6, 7]]
    assert len(PretrainingSampler(10, 0, 4, 1, 2, drop_last=False)) == 1


@pytest.mark.parametrize("args, pattern", [
    ((10, 10, 1, 0, 1), r"consumed_samples \(10\) >= the dataset's 10 samples"),
    ((10, 3, 2, 0, 1), r"not a multiple of micro_batch_size \(2\) \* data_parallel_size \(1\)"),
    ((10, 0, 1, 2, 2), r"data_parallel_rank \(2\) must be in 0..1"),
    ((10, 0, 0, 0, 1), "micro_batch_size must be an integer >= 1"),
    ((0, 0, 1, 0, 1), "total_samples must be an integer >= 1"),
    ((10, -2, 1, 0, 1), "consumed_samples must be an integer >= 0"),
])
def test_bad_arguments_are_refused(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        PretrainingSampler(*args)
