"""BlendableDataset: weight checks (A8), GPT-NeoX's order, shares, prefix balance."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from megatron.data import blendable_dataset
from megatron.data.blendable_dataset import BlendableDataset, blend_indices, normalize_weights


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


def gpt_neox_order(weights, size):
    """GPT-NeoX's build_blending_indices (megatron/data/helpers.cpp), transcribed: sample s goes
    to the first dataset with the largest weight * max(s, 1) - its samples so far."""
    weights = np.asarray(weights, dtype=np.float64)
    weights = weights / np.sum(weights)  # BlendableDataset.__init__
    current = [0] * len(weights)
    out = []
    for sample in range(size):
        sd = max(float(sample), 1.0)
        best, best_error = 0, weights[0] * sd - current[0]
        for i in range(1, len(weights)):
            error = weights[i] * sd - current[i]
            if error > best_error:
                best, best_error = i, error
        out.append(best)
        current[best] += 1
    return out


def neox_normalized(weights):
    """get_normalized_weights_and_num_samples (megatron/data/data_utils.py) without counts."""
    return [w / sum(weights) for w in weights]


RNG = np.random.default_rng(7)
ORDER_CASES = [[0.7, 0.3], [1, 1], [1, 1, 1], [0.5, 0.3, 0.2], [0.999, 0.001], [3, 1e-3, 7, 2],
               list(RNG.dirichlet(np.ones(22))), list(RNG.dirichlet(np.full(9, 0.3)))]


@pytest.mark.parametrize("weights", ORDER_CASES, ids=lambda w: f"{len(w)}-datasets")
@pytest.mark.parametrize("block, burn_in", [(blendable_dataset.BLOCK, blendable_dataset.BURN_IN),
                                            (5, 0), (64, 2)], ids=["default", "tiny", "small"])
def test_the_order_is_gpt_neoxs_sample_for_sample(weights, block, burn_in, monkeypatch):
    """The blocks' guessed starting counts are wrong far more often with short blocks and no
    burn-in: those are recomputed one by one, and the order is still GPT-NeoX's."""
    monkeypatch.setattr(blendable_dataset, "BLOCK", block)
    monkeypatch.setattr(blendable_dataset, "BURN_IN", burn_in)
    size = 3000 if block < 100 else 20011
    w = normalize_weights(weights, len(weights))
    assert w.tolist() == neox_normalized(weights)
    assert blend_indices(w, size)[0].tolist() == gpt_neox_order(neox_normalized(weights), size)


def test_a_dataset_of_weight_zero_is_never_read():
    assert 0 not in blend_indices(np.array([0.0, 1.0]), 50)[0]
    assert blend_indices(np.array([0.5, 0.0, 0.5]), 6)[0].tolist() == [0, 2, 0, 2, 0, 2]


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
        blend = BlendableDataset([Numbers("a", 100), Numbers("b", 100), Numbers("c", 100)],
                                 [1.0, 1e-5, 1e-5], num_samples=100,
                                 names=["big", "tiny", "tinier"])
    assert "differ by more than 10000 x" in caplog.text and "tiny: 1e-05" in caplog.text
    assert "tinier has weight 1e-05 but gets no sample out of 100" in caplog.text
    assert "tiny has weight" not in caplog.text
    # GPT-NeoX's rule takes samples 0 and 1 at the same max(s, 1): the second goes to the
    # dataset furthest below its share after the first, whatever its weight
    assert [blend[i] for i in range(3)] == [("a", 0), ("b", 0), ("a", 1)]


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
