"""`BlendableDataset`: a weighted mix of datasets in GPT-NeoX's order.

Sample s of the mix comes from the dataset furthest below its share: the one with the largest
`w_i * max(s, 1) - c_i` (c_i: the samples it gave so far; the first of equal ones), and is that
dataset's next sample, as GPT-NeoX's compiled helper (`build_blending_indices`) picks them, float
for float: with the same weights and datasets the mix is GPT-NeoX's, and each dataset's share of
any prefix of it stays within about one sample of its weight.

The rule is sequential; it is computed without a Python loop over samples:

1. Candidate: the mix is cut into blocks of `BLOCK` samples, all simulated at once (numpy over
   the blocks), each from the counts its start would have if every prefix were apportioned by
   largest remainders, `BURN_IN` samples early. A guessed state usually meets the true one
   within the burn-in, and from the step where the counts are equal both pick alike.
2. Check: block 0 starts from the true (empty) counts. A block whose counts at its start equal
   its predecessor's at its end therefore picks as the rule does; one whose counts differ is
   recomputed sample by sample (Python) from the true counts until the two meet.

The result is the rule's whatever the candidate: the candidate only decides the speed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from megatron.monitoring.logger import get_logger

logger = get_logger(__name__)

MAX_WEIGHT_RATIO = 1e4
BLOCK = 4096  # samples per simulated block of the candidate
BURN_IN = 1024  # samples each block is simulated for before its start


def normalize_weights(weights: Sequence[float], num_datasets: int,
                      names: Sequence[str] | None = None) -> np.ndarray:
    """Check blend weights (A8) and return them summing to 1 (each divided by their sum taken
    in order, as GPT-NeoX's data_utils normalises them).

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
    total = sum(float(x) for x in w)  # in order, not numpy's pairwise sum
    if total <= 0:
        raise ValueError(f"blend weights {w.tolist()} are all zero; at least one data path "
                         "needs a positive weight")
    w = np.array([float(x) / total for x in w])
    positive = w[w > 0]
    if positive.max() / positive.min() > MAX_WEIGHT_RATIO:
        shares = ", ".join(f"{n}: {p:.3g}" for n, p in zip(names, w))
        logger.warning("blend weights differ by more than %g x; effective proportions: %s",
                       MAX_WEIGHT_RATIO, shares)
    return w


def blend_indices(weights: np.ndarray, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index, dataset_sample_index) of a mix of `num_samples` samples; `weights` are
    divided by their numpy sum, as GPT-NeoX's BlendableDataset divides the ones it is given."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / np.sum(w)
    n = int(num_samples)
    # A dataset of weight 0 is never picked (GPT-NeoX's rule may pick it on a tie at error 0,
    # reading a sample it was not built with).
    live = np.flatnonzero(w > 0).astype(np.int32)
    if len(live) > 1 and n > 0:
        picks, at_start, at_end = _candidate(w[live], n)
        _make_exact(w[live], picks, at_start, at_end)
        picks = live[picks]
    else:
        picks = np.full(n, live[0], dtype=np.int32)
    counts = np.bincount(picks, minlength=len(w))
    # The k-th occurrence of dataset i reads its sample k.
    order = np.argsort(picks, kind="stable")
    starts = np.cumsum(counts) - counts
    dataset_sample_index = np.empty(n, dtype=np.int64)
    dataset_sample_index[order] = np.arange(n) - starts[picks[order]]
    return picks, dataset_sample_index


def _guessed_counts(w: np.ndarray, at: np.ndarray) -> np.ndarray:
    """float64 [len(at), m]: the largest-remainder apportionment of each `at` samples."""
    exact = w[None, :] * at[:, None].astype(np.float64)
    counts = np.floor(exact)
    short = at - counts.sum(axis=1).astype(np.int64)
    order = np.argsort(-(exact - counts), axis=1, kind="stable")  # largest remainder first
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(len(w))[None, :].repeat(len(at), 0), axis=1)
    return counts + (ranks < short[:, None])


def _candidate(w: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rule simulated over blocks at once, each from a guessed state: (int32[n] picks,
    each block's counts at its start and at its end, float64 [blocks, m])."""
    picks = np.zeros(n, dtype=np.int32)
    starts = np.arange(0, n, BLOCK, dtype=np.int64)
    ends = np.minimum(starts + BLOCK, n)
    s = np.maximum(starts - BURN_IN, 0)
    counts = _guessed_counts(w, s)
    at_start, at_end = np.empty_like(counts), np.empty_like(counts)
    rows = np.arange(len(starts))
    errors = np.empty_like(counts)
    for _ in range(int((ends - s).max())):
        starting = s == starts
        at_start[starting] = counts[starting]
        np.multiply(w[None, :], np.maximum(s, 1).astype(np.float64)[:, None], out=errors)
        errors -= counts
        chosen = errors.argmax(axis=1)
        keep = (s >= starts) & (s < ends)
        picks[s[keep]] = chosen[keep]
        counts[rows, chosen] += 1
        s += 1
        ending = s == ends
        at_end[ending] = counts[ending]
    return picks, at_start, at_end


def _make_exact(w: np.ndarray, picks: np.ndarray, at_start: np.ndarray,
                at_end: np.ndarray) -> None:
    """Turn the candidate into the rule's picks, in place. Block 0 starts from the true (empty)
    counts; a block whose start counts are the true ones picks as the rule does, so that its
    end counts are true too. A block that starts from other counts is recomputed one by one
    until its counts meet the true ones (module docstring, step 2)."""
    starts = np.arange(0, len(picks), BLOCK, dtype=np.int64)
    ends = np.minimum(starts + BLOCK, len(picks))
    wrong = np.flatnonzero(~(at_start[1:] == at_end[:-1]).all(axis=1)) + 1
    done = 0  # blocks before this one are right
    for j in wrong:
        if j < done:
            continue
        true = at_end[j - 1]
        while j < len(starts):
            true = _repair(w, picks, int(starts[j]), int(ends[j]), true, at_start[j])
            if true is None:  # met: the rest of block j is right
                break
            j += 1
            if j < len(starts) and np.array_equal(true, at_start[j]):
                break
        done = j + 1


def _repair(w: np.ndarray, picks: np.ndarray, pos: int, stop: int, true: np.ndarray,
            candidate: np.ndarray) -> np.ndarray | None:
    """Recompute `picks[pos:stop]` one by one from the true counts `true` (the candidate's
    being `candidate`) until the two meet: None when they do, else the true counts at `stop`."""
    weights = [float(x) for x in w]
    true_counts = [int(c) for c in true]
    candidate_counts = [int(c) for c in candidate]
    for at in range(pos, stop):
        sd = max(float(at), 1.0)
        errors = [x * sd - c for x, c in zip(weights, true_counts)]
        best = errors.index(max(errors))
        candidate_counts[int(picks[at])] += 1
        picks[at] = best
        true_counts[best] += 1
        if true_counts == candidate_counts:
            return None
    return np.array(true_counts, dtype=np.float64)


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
        self.dataset_index, self.dataset_sample_index = blend_indices(
            np.asarray(list(weights), dtype=np.float64), self.size)
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
