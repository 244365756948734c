"""`BlendableDataset`: a deterministic weighted mix of datasets.

Over the mix's N samples, dataset i contributes exactly c_i samples, where the c_i are the
largest-remainder rounding of w_i * N (so |c_i - w_i * N| < 1: each share is within 1/N of its
weight). The samples are interleaved by a balanced binary split of the datasets: at each split a
prefix of n positions gives group A round(C_A * n / C) of them, so every prefix of the mix stays
close to the weights too (within about 1.5 samples per dataset, 0.5 for two datasets). Building
is O(N log m) numpy with no loop over samples: millions of samples take a fraction of a second.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from megatron.monitoring.logger import get_logger

logger = get_logger(__name__)

MAX_WEIGHT_RATIO = 1e4


def normalize_weights(weights: Sequence[float], num_datasets: int,
                      names: Sequence[str] | None = None) -> np.ndarray:
    """Check blend weights (A8) and return them summing to 1.

    They must be one per dataset, finite, >= 0 and not all zero; a ratio between the largest and
    the smallest non-zero weight above 1e4 is warned about with the effective proportions.
    """
    names = list(names) if names is not None else [f"dataset {i}" for i in range(num_datasets)]
    w = np.asarray(list(weights), dtype=np.float64)
    if w.ndim != 1 or len(w) != num_datasets:
        raise ValueError(f"got {w.size} blend weight(s) for {num_datasets} dataset(s) "
                         f"({', '.join(names)}); give exactly one weight per data path")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"blend weights must be finite and >= 0, got {w.tolist()} for "
                         f"{', '.join(names)}")
    if w.sum() <= 0:
        raise ValueError(f"blend weights {w.tolist()} are all zero; at least one data path "
                         "needs a positive weight")
    w = w / w.sum()
    positive = w[w > 0]
    if positive.max() / positive.min() > MAX_WEIGHT_RATIO:
        shares = ", ".join(f"{n}: {p:.3g}" for n, p in zip(names, w))
        logger.warning("blend weights differ by more than %g x; effective proportions: %s",
                       MAX_WEIGHT_RATIO, shares)
    return w


def sample_counts(weights: np.ndarray, num_samples: int) -> np.ndarray:
    """Integer samples per dataset summing to `num_samples`, each within 1 of weight * N."""
    exact = weights * num_samples
    counts = np.floor(exact).astype(np.int64)
    short = num_samples - int(counts.sum())
    order = np.lexsort((np.arange(len(weights)), -(exact - counts)))  # largest remainder first
    counts[order[:short]] += 1
    return counts


def blend_indices(weights: np.ndarray, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index, dataset_sample_index) for a mix of `num_samples` samples."""
    counts = sample_counts(np.asarray(weights, dtype=np.float64), num_samples)
    ids = [i for i in range(len(counts)) if counts[i] > 0]
    dataset_index = _interleave(ids, counts, num_samples)
    # The k-th occurrence of dataset i reads its sample k.
    order = np.argsort(dataset_index, kind="stable")
    starts = np.cumsum(counts) - counts
    dataset_sample_index = np.empty(num_samples, dtype=np.int64)
    dataset_sample_index[order] = np.arange(num_samples) - starts[dataset_index[order]]
    return dataset_index, dataset_sample_index


def _interleave(ids: list[int], counts: np.ndarray, length: int) -> np.ndarray:
    """Which dataset each of `length` positions reads, given each dataset's total count."""
    if len(ids) == 1 or length == 0:
        return np.full(length, ids[0], dtype=np.int32)
    group_a, group_b = _balanced_halves(ids, counts)
    count_a = int(counts[group_a].sum())
    n = np.arange(1, length + 1, dtype=np.int64)
    taken_a = (2 * count_a * n + length) // (2 * length)  # round(count_a * n / length)
    in_a = np.diff(taken_a, prepend=0).astype(bool)
    out = np.empty(length, dtype=np.int32)
    out[in_a] = _interleave(group_a, counts, count_a)
    out[~in_a] = _interleave(group_b, counts, length - count_a)
    return out


def _balanced_halves(ids: list[int], counts: np.ndarray) -> tuple[list[int], list[int]]:
    """Split datasets into two groups of near-equal total count (largest first, to the lighter)."""
    a: list[int] = []
    b: list[int] = []
    total_a = total_b = 0
    for i in sorted(ids, key=lambda i: (-counts[i], i)):
        if total_a <= total_b:
            a.append(i)
            total_a += counts[i]
        else:
            b.append(i)
            total_b += counts[i]
    return a, b


class BlendableDataset(torch.utils.data.Dataset):
    """`num_samples` samples (default: the datasets' total length) mixed by `weights`.

    A dataset asked for more samples than it holds is read again from its start, with a warning.
    """

    def __init__(self, datasets: Sequence, weights: Sequence[float],
                 num_samples: int | None = None, names: Sequence[str] | None = None):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("BlendableDataset needs at least one dataset")
        names = list(names) if names is not None else [
            getattr(d, "name", f"dataset {i}") for i, d in enumerate(self.datasets)]
        self.weights = normalize_weights(weights, len(self.datasets), names)
        self.size = int(num_samples if num_samples is not None
                        else sum(len(d) for d in self.datasets))
        if self.size < 1:
            raise ValueError(f"BlendableDataset needs num_samples >= 1, got {self.size}")
        self.dataset_index, self.dataset_sample_index = blend_indices(self.weights, self.size)
        self._check_counts(names)

    def _check_counts(self, names: list[str]) -> None:
        counts = np.bincount(self.dataset_index, minlength=len(self.datasets))
        shares = ", ".join(f"{n}: {c} ({c / self.size:.3%})" for n, c in zip(names, counts))
        logger.info("blending %d samples: %s", self.size, shares)
        for i, (name, weight, count) in enumerate(zip(names, self.weights, counts)):
            if weight > 0 and count == 0:
                logger.warning("%s has weight %.3g but gets no sample out of %d (A8); effective "
                               "proportions: %s", name, weight, self.size, shares)
            if count > len(self.datasets[i]):
                logger.warning("%s is asked for %d samples but holds %d; it will be repeated",
                               name, count, len(self.datasets[i]))
                self.dataset_sample_index[self.dataset_index == i] %= len(self.datasets[i])

    def indexed_datasets(self) -> list:
        """The token files the blended datasets read (for fingerprints, A17)."""
        return [ix for d in self.datasets for ix in d.indexed_datasets()]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int):
        if not -self.size <= idx < self.size:
            raise IndexError(f"sample {idx} out of range for a blend of {self.size} samples")
        return self.datasets[int(self.dataset_index[idx])][int(self.dataset_sample_index[idx])]
