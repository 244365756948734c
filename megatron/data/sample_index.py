"""Pure numpy construction of the three indices behind `GPT2Dataset` (no loops over samples).

The documents of one split, repeated for as many epochs as the requested samples need, are
shuffled into `doc_idx` and read as one token stream. Sample i is the `seq_length + 1` tokens
starting at stream position i * seq_length (consecutive samples share one token: the last label of
one is the first input of the next). `sample_idx[i] = (j, offset)` says where position
i * seq_length falls: in document doc_idx[j] at `offset`; row i + 1 says where sample i ends
(inclusive). `shuffle_idx` is a permutation of the sample numbers.

The random draws replay GPT-NeoX's: one `np.random.RandomState(seed)` shuffles `doc_idx` and
then `shuffle_idx`, so the same data, seed and lengths give GPT-NeoX's sample order.
"""

from __future__ import annotations

import numpy as np


def tokens_per_epoch(sizes: np.ndarray, documents: np.ndarray) -> int:
    """Tokens in one pass over `documents`."""
    return int(np.asarray(sizes)[documents].sum(dtype=np.int64))


def samples_per_epoch(num_tokens: int, seq_length: int) -> int:
    """Whole samples one pass over `num_tokens` tokens gives (samples share a boundary token)."""
    return max(0, (num_tokens - 1) // seq_length)


def num_epochs(num_tokens: int, seq_length: int, num_samples: int) -> int:
    """Fewest epochs E with (E * num_tokens - 1) // seq_length >= num_samples."""
    if num_tokens <= 0:
        raise ValueError("cannot build samples from documents holding 0 tokens")
    return max(1, -(-(num_samples * seq_length + 1) // num_tokens))


def build_doc_idx(documents: np.ndarray, epochs: int, rng: np.random.RandomState) -> np.ndarray:
    """int32[epochs * len(documents)]: the documents repeated `epochs` times, shuffled together."""
    doc_idx = np.tile(np.asarray(documents, dtype=np.int32), epochs)
    rng.shuffle(doc_idx)
    return doc_idx


def build_sample_idx(sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int,
                     num_tokens: int) -> np.ndarray:
    """[n + 1, 2] (position in doc_idx, token offset) of every sample start, n = all samples.

    `num_tokens` is the length of the whole stream (tokens per epoch * epochs). Documents of
    length 0 are never pointed into.
    """
    lengths = np.asarray(sizes)[doc_idx]  # sizes' own dtype (int32): half the memory traffic
    ends = np.cumsum(lengths, dtype=np.int64)  # ends[j]: stream position just past document j
    assert ends[-1] == num_tokens, "stream length does not match the documents' sizes"
    n = samples_per_epoch(num_tokens, seq_length)
    positions = np.arange(n + 1, dtype=np.int64) * seq_length
    which = np.searchsorted(ends, positions, side="right")
    dtype = np.int32 if max(len(doc_idx), int(lengths.max())) < 2**31 else np.int64
    sample_idx = np.empty((n + 1, 2), dtype=dtype)
    sample_idx[:, 0] = which
    sample_idx[:, 1] = positions - ends[which] + lengths[which]
    return sample_idx


def build_shuffle_idx(num_samples: int, rng: np.random.RandomState) -> np.ndarray:
    """A permutation of 0..num_samples-1 (uint32 when it fits, else int64)."""
    dtype = np.uint32 if num_samples < np.iinfo(np.uint32).max - 1 else np.int64
    shuffle_idx = np.arange(num_samples, dtype=dtype)
    rng.shuffle(shuffle_idx)
    return shuffle_idx


def build_indices(sizes: np.ndarray, documents: np.ndarray, seq_length: int, num_samples: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(doc_idx, sample_idx, shuffle_idx, epochs) for `num_samples` samples of `documents`."""
    per_epoch = tokens_per_epoch(sizes, documents)
    epochs = num_epochs(per_epoch, seq_length, num_samples)
    rng = np.random.RandomState(seed=seed)
    doc_idx = build_doc_idx(documents, epochs, rng)
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, per_epoch * epochs)
    shuffle_idx = build_shuffle_idx(sample_idx.shape[0] - 1, rng)
    return doc_idx, sample_idx, shuffle_idx, epochs


def check_indices(doc_idx: np.ndarray, sample_idx: np.ndarray, shuffle_idx: np.ndarray,
                  documents: np.ndarray, sizes: np.ndarray, seq_length: int,
                  num_samples: int) -> str | None:
    """Why loaded indices cannot belong to these inputs, or None when they are consistent."""
    per_epoch = tokens_per_epoch(sizes, documents)
    epochs = num_epochs(per_epoch, seq_length, num_samples)
    n = samples_per_epoch(per_epoch * epochs, seq_length)
    if doc_idx.ndim != 1 or doc_idx.shape[0] != epochs * len(documents):
        return f"doc_idx has shape {doc_idx.shape}, expected ({epochs * len(documents)},)"
    if not np.issubdtype(doc_idx.dtype, np.integer):
        return f"doc_idx has dtype {doc_idx.dtype}, expected integers"
    if len(documents) and (doc_idx.min() < documents.min() or doc_idx.max() > documents.max()):
        return "doc_idx points outside the split's documents"
    if sample_idx.shape != (n + 1, 2) or not np.issubdtype(sample_idx.dtype, np.integer):
        return f"sample_idx has shape {sample_idx.shape}, expected ({n + 1}, 2)"
    if sample_idx[:, 0].min() < 0 or sample_idx[:, 0].max() >= len(doc_idx):
        return "sample_idx points outside doc_idx"
    if np.any(np.diff(sample_idx[:, 0]) < 0):
        return "sample_idx is not in stream order"
    if shuffle_idx.shape != (n,) or not np.issubdtype(shuffle_idx.dtype, np.integer):
        return f"shuffle_idx has shape {shuffle_idx.shape}, expected ({n},)"
    if n and (shuffle_idx.min() < 0 or shuffle_idx.max() >= n):
        return "shuffle_idx points outside the samples"
    return None
