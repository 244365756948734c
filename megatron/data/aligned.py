"""Files that go with a token file position by position or document by document: label files
(which positions carry loss), reward files (KTO) and the rejected side of chosen/rejected pairs.
Each is checked against its token file when opened; a mismatch names both files (A35).

    labels = open_labels(label_prefix, tokens)        # same documents and sizes, labels agree
    rewards = read_rewards(reward_prefix, tokens)     # float64[documents]
    check_pair(pos_tokens, neg_tokens)                 # same number of documents
    keep = supervised_documents(labels, seq_length)   # bool[documents]: a label within reach

A label file holds, at each position, the token id there when the position carries loss and
IGNORE_LABEL (-100) when it does not (GPT-NeoX's convention, not shifted: the loss at input
position t predicts the label at t + 1).
"""

from __future__ import annotations

import numpy as np

from megatron.data.indexed_dataset import (IGNORE_LABEL, MMapIndexedDataset, data_file_path,
                                           index_file_path)

LABEL_SAMPLE_DOCUMENTS = 64  # documents compared value by value when a label file is opened


def _open(prefix: str, what: str, beside: str) -> MMapIndexedDataset:
    if not MMapIndexedDataset.exists(prefix):
        raise FileNotFoundError(f"{what} {prefix} (.bin/.idx) does not exist (beside the token "
                                f"file {beside}); check the path in the config")
    return MMapIndexedDataset(prefix)


def open_labels(prefix: str, tokens: MMapIndexedDataset) -> MMapIndexedDataset:
    """The label file `prefix` of `tokens`, checked: as many documents, each of the same length,
    and on a sample of documents every label either the token beside it or -100."""
    labels = _open(prefix, "label file", tokens.path)
    both = f"label file {index_file_path(prefix)} and token file {index_file_path(tokens.path)}"
    if len(labels) != len(tokens):
        raise ValueError(f"{both} do not belong together: {len(labels)} vs {len(tokens)} "
                         "documents; give the label file written with this token file")
    differ = np.flatnonzero(labels.sizes != tokens.sizes)
    if differ.size:
        d = int(differ[0])
        raise ValueError(f"{both} do not belong together: document {d} has "
                         f"{int(labels.sizes[d])} labels and {int(tokens.sizes[d])} tokens "
                         f"({differ.size} documents differ); give the label file written with "
                         "this token file")
    for d in _spread(len(tokens), LABEL_SAMPLE_DOCUMENTS):
        lab, tok = labels.get(d), tokens.get(d)
        wrong = np.flatnonzero((lab != tok) & (lab != IGNORE_LABEL))
        if wrong.size:
            t = int(wrong[0])
            raise ValueError(f"{both} do not belong together: document {d} position {t} has "
                             f"label {int(lab[t])} where the token is {int(tok[t])} (a label is "
                             f"the token itself or {IGNORE_LABEL}); give the label file written "
                             "with this token file")
    return labels


def read_rewards(prefix: str, tokens: MMapIndexedDataset) -> np.ndarray:
    """float64[documents]: the reward of each document of `tokens`, from the reward file
    `prefix` (one value per document; GPT-NeoX wrote them as integers, this project as floats)."""
    rewards = _open(prefix, "reward file", tokens.path)
    both = f"reward file {index_file_path(prefix)} and token file {index_file_path(tokens.path)}"
    if len(rewards) != len(tokens):
        raise ValueError(f"{both} do not belong together: {len(rewards)} vs {len(tokens)} "
                         "documents; give the reward file written with this token file")
    if len(rewards) and np.any(rewards.sizes != 1):
        d = int(np.flatnonzero(rewards.sizes != 1)[0])
        raise ValueError(f"{data_file_path(prefix)}: document {d} has {int(rewards.sizes[d])} "
                         "reward values; a reward file holds one value per document")
    values = np.concatenate(rewards[0:len(rewards)]) if len(rewards) else np.zeros(0)
    return values.astype(np.float64)


def check_pair(pos: MMapIndexedDataset, neg: MMapIndexedDataset) -> None:
    """Chosen and rejected responses pair by document number: as many of each."""
    if len(pos) != len(neg):
        raise ValueError(f"chosen-response file {index_file_path(pos.path)} has {len(pos)} "
                         f"documents but rejected-response file {index_file_path(neg.path)} has "
                         f"{len(neg)}; pair i is document i of each, so they must have as many "
                         "(preprocess both from the same jsonl)")


def supervised_documents(labels: MMapIndexedDataset, seq_length: int,
                         chunk_documents: int = 65536) -> np.ndarray:
    """bool[documents]: whether a document has a label that a sample of seq_length + 1 tokens
    trains on (a position 1 .. seq_length with a label >= 0; position 0 is never a target)."""
    keep = np.zeros(len(labels), dtype=bool)
    reach = seq_length + 1
    for first in range(0, len(labels), chunk_documents):
        last = min(len(labels), first + chunk_documents)
        for d, doc in enumerate(labels[first:last], start=first):
            keep[d] = bool(np.any(doc[1:reach] >= 0))
    return keep


def _spread(n: int, count: int) -> list[int]:
    """Up to `count` document numbers spread over 0..n-1, first and last included."""
    if n <= count:
        return list(range(n))
    return sorted({int(round(i * (n - 1) / (count - 1))) for i in range(count)})
