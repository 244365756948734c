"""BlendableDataset: weight checks (A8), exact shares, prefix balance, speed."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from megatron.data.blendable_dataset import (BlendableDataset, blend_indices,
                                             normalize_weights, sample_counts)


class Numbers:
    """A dataset whose sample k is (tag, k)."""

    def __init__(self, tag, size):
        self.tag, self.size = tag, size

    def __len__(self):
        return self.size

    def __getitem__(self, k):
        if not 0 <= k < self.size:
            raise IndexError(k)
        return (self.tag, k)


def prefix_deviation(dataset_index, weights):
    counts = np.zeros(len(weights))
    worst = 0.0
    for n, d in enumerate(dataset_index, start=1):
        counts[d] += 1
        worst = max(worst, float(np.abs(counts - weights * n).max()))
    return worst


@pytest.mark.parametrize("weights, n", [
    ([0.5, 0.3, 0.2], 1000), ([1, 1], 7), ([3, 1e-3, 7, 2], 12345), ([0.91] + [0.01] * 9, 997),
    ([1, 0, 2], 10),
])
def test_each_share_is_within_one_over_n(weights, n):
    w = normalize_weights(weights, len(weights))
    dataset_index, sample_index = blend_indices(w, n)
    counts = np.bincount(dataset_index, minlength=len(w))
    assert counts.sum() == n
    assert np.all(np.abs(counts / n - w) < 1 / n)
    for i in range(len(w)):  # each dataset is read in order 0, 1, 2, ...
        assert np.array_equal(sample_index[dataset_index == i], np.arange(counts[i]))


def test_prefixes_stay_balanced():
    w = np.array([0.7, 0.3])
    dataset_index, _ = blend_indices(w, 2000)
    assert prefix_deviation(dataset_index, w) <= 1.0
    w = np.array([0.5, 0.3, 0.2])
    dataset_index, _ = blend_indices(w, 2000)
    assert prefix_deviation(dataset_index, w) < 1.5


def test_deterministic():
    w = normalize_weights([2, 3, 5], 3)
    a, b = blend_indices(w, 5000), blend_indices(w, 5000)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_millions_of_samples_build_fast():
    w = normalize_weights([0.5, 0.25, 0.125, 0.125], 4)
    start = time.perf_counter()
    dataset_index, _ = blend_indices(w, 2_000_000)
    assert time.perf_counter() - start < 1.0
    assert np.all(np.abs(np.bincount(dataset_index) - w * 2_000_000) < 1)


@pytest.mark.parametrize("weights, pattern", [
    ([1.0], "got 1 blend weight\\(s\\) for 2 dataset\\(s\\)"),
    ([1.0, float("nan")], "finite and >= 0"),
    ([1.0, -0.5], "finite and >= 0"),
    ([0.0, 0.0], "all zero"),
])
def test_bad_weights_are_refused(weights, pattern):
    with pytest.raises(ValueError, match=pattern):
        normalize_weights(weights, 2)


def test_extreme_ratio_and_starved_dataset_are_warned(caplog):
    with caplog.at_level(logging.WARNING, logger="megatron"):
        blend = BlendableDataset([Numbers("a", 100), Numbers("b", 100)], [1.0, 1e-5],
                                 num_samples=100, names=["big", "tiny"])
    assert "differ by more than 10000 x" in caplog.text and "tiny: 1e-05" in caplog.text
    assert "tiny has weight 1e-05 but gets no sample out of 100" in caplog.text
    assert [blend[i] for i in range(3)] == [("a", 0), ("a", 1), ("a", 2)]


def test_items_come_from_the_chosen_dataset():
    blend = BlendableDataset([Numbers("a", 10), Numbers("b", 30)], [1, 3])
    assert len(blend) == 40
    items = [blend[i] for i in range(len(blend))]
    assert sorted(k for t, k in items if t == "a") == list(range(10))
    assert sorted(k for t, k in items if t == "b") == list(range(30))
    with pytest.raises(IndexError):
        blend[40]


def test_overdrawn_dataset_repeats_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="megatron"):
        blend = BlendableDataset([Numbers("a", 3), Numbers("b", 100)], [1, 1], num_samples=20)
    assert "asked for 10 samples but holds 3" in caplog.text
    assert {blend[i] for i in range(20) if blend[i][0] == "a"} == {("a", 0), ("a", 1), ("a", 2)}


def test_sample_counts_sum_exactly():
    counts = sample_counts(np.array([1 / 3, 1 / 3, 1 / 3]), 10)
    assert counts.tolist() == [4, 3, 3]
