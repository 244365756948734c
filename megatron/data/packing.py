"""Samples made of whole documents (`pack_impl` unpacked and pack_until_overflow): pure numpy.

    samples = pack_documents(lengths, documents, seq_length, num_samples, seed, "unpacked",
                             allow_chopped=True)
    docs_of_sample_i = samples.doc_idx[samples.starts[i]:samples.starts[i + 1]]

A sample holds at most seq_length + 1 tokens (the model's inputs and, shifted by one, its
targets) and is padded to that length by the dataset. `lengths[d]` is the length that decides
whether document d fits: its token count, or for a chosen/rejected pair the longer of the two.

- unpacked: one document per sample.
- pack_until_overflow: whole documents are added to a sample while the total stays within
  seq_length + 1 tokens; the document that would overflow starts the next sample.

A document longer than seq_length + 1 is cut to fit and sits alone in its sample
(`allow_chopped`), or is left out. Documents are taken epoch after epoch, each epoch a fresh
shuffle of the eligible documents by one `np.random.RandomState(seed)`, until `num_samples`
samples exist; `shuffle_idx` then permutes the samples with the same generator, so the order is
random across epochs and the same on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("unpacked", "pack_until_overflow")


@dataclass(frozen=True)
class DocumentSamples:
    """CSR layout: sample j holds documents doc_idx[starts[j]:starts[j + 1]], in order."""

    doc_idx: np.ndarray  # int64 document numbers
    starts: np.ndarray  # int64 [n + 1]
    shuffle_idx: np.ndarray  # permutation of 0..n-1
    epochs: int
    eligible: int  # documents that can be read (after leaving out the too long ones)

    def __len__(self) -> int:
        return int(len(self.shuffle_idx))

    def documents_of(self, sample: int) -> np.ndarray:
        j = int(self.shuffle_idx[sample])
        return self.doc_idx[self.starts[j]:self.starts[j + 1]]


def eligible_documents(lengths: np.ndarray, documents: np.ndarray, seq_length: int,
                       allow_chopped: bool, keep: np.ndarray | None = None) -> np.ndarray:
    """`documents` that can make samples: non-empty, kept by `keep` (a per-document mask over
    all documents, e.g. "has a token that carries loss"), and not too long unless chopped."""
    documents = np.asarray(documents, dtype=np.int64)
    sizes = np.asarray(lengths)[documents]
    ok = sizes > 0
    if not allow_chopped:
        ok &= sizes <= seq_length + 1
    if keep is not None:
        ok &= np.asarray(keep, dtype=bool)[documents]
    return documents[ok]


def pack_documents(lengths: np.ndarray, documents: np.ndarray, seq_length: int,
                   num_samples: int, seed: int, mode: str, allow_chopped: bool = True,
                   keep: np.ndarray | None = None) -> DocumentSamples:
    """At least `num_samples` samples of whole `documents` (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"pack_impl {mode!r} does not make samples of whole documents; "
                         f"choose one of {', '.join(MODES)}")
    eligible = eligible_documents(lengths, documents, seq_length, allow_chopped, keep)
    if len(eligible) == 0:
        return DocumentSamples(np.zeros(0, np.int64), np.zeros(1, np.int64),
                               np.zeros(0, np.int64), 0, 0)
    capacity = seq_length + 1
    rng = np.random.RandomState(seed=seed)
    orders, starts, total, epochs = [], [np.zeros(1, np.int64)], 0, 0
    while total < num_samples:
        order = eligible.copy()
        rng.shuffle(order)
        if mode == "unpacked":
            cuts = np.arange(1, len(order) + 1, dtype=np.int64)
        else:
            cuts = _greedy_cuts(np.minimum(np.asarray(lengths)[order], capacity), capacity)
        starts.append(cuts + sum(len(o) for o in orders))
        orders.append(order)
        total += len(cuts)
        epochs += 1
    doc_idx = np.concatenate(orders)
    sample_starts = np.concatenate(starts)
    shuffle_idx = np.arange(total, dtype=np.int64)
    rng.shuffle(shuffle_idx)
    return DocumentSamples(doc_idx, sample_starts, shuffle_idx, epochs, len(eligible))


def _greedy_cuts(sizes: np.ndarray, capacity: int) -> np.ndarray:
    """Ends (exclusive) of each sample when `sizes` are packed in order, a new sample starting
    at the document that would overflow `capacity`."""
    cuts, used = [], 0
    for i, size in enumerate(sizes.tolist()):
        if used and used + size > capacity:
            cuts.append(i)
            used = 0
        used += size
    cuts.append(len(sizes))
    return np.asarray(cuts, dtype=np.int64)
