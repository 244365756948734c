"""Samples of whole documents, padded (`pack_impl` unpacked or pack_until_overflow): the datasets
of fine-tuning and preference training.

    DocumentDataset(...)[i] -> {"text", "label", "segment"[, "reward"]}        (dataset_impl gpt2)
    PairwiseDataset(...)[i] -> {"pos", "pos_label", "pos_segment",
                                "neg", "neg_label", "neg_segment"}           (dataset_impl pairwise)

Every array has seq_length + 1 entries. `text` holds the sample's documents back to back, then
`pad_id`. `label` is the label file's values there (the tokens themselves without a label file)
and -100 on padding, so padding never carries loss. `segment` numbers the documents of the
sample 0, 1, ... and is -1 on padding: it lets attention and position ids restart at each
document and lets DPO, KTO and the reward model score each document (or pair) on its own.
`reward` (KTO) repeats each document's reward over its tokens, 0 on padding.

A pair is document i of the chosen file and document i of the rejected file; both sides of a
sample hold the same pairs in the same order, packed by the longer side. Which documents can be
read: non-empty, no longer than seq_length + 1 unless `allow_chopped` (then cut), and with a
label file, holding at least one label that the sample trains on (both sides, for pairs).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from megatron.data.aligned import supervised_documents
from megatron.data.indexed_dataset import IGNORE_LABEL, MMapIndexedDataset
from megatron.data.packing import pack_documents
from megatron.monitoring.logger import get_logger

logger = get_logger(__name__)


class _Side:
    """One token file of a dataset with its label file (None: every token is a label)."""

    def __init__(self, tokens: MMapIndexedDataset, labels: MMapIndexedDataset | None):
        self.tokens, self.labels = tokens, labels

    def fill(self, docs: np.ndarray, length: int, pad_id: int, rewards: np.ndarray | None):
        text = np.full(length, pad_id, dtype=np.int64)
        label = np.full(length, IGNORE_LABEL, dtype=np.int64)
        segment = np.full(length, -1, dtype=np.int64)
        reward = np.zeros(length, dtype=np.float32) if rewards is not None else None
        at = 0
        for k, d in enumerate(docs.tolist()):
            n = min(int(self.tokens.sizes[d]), length - at)
            if n <= 0:
                break
            text[at:at + n] = self.tokens.get(d, length=n)
            label[at:at + n] = self.labels.get(d, length=n) if self.labels is not None \
                else text[at:at + n]
            segment[at:at + n] = k
            if reward is not None:
                reward[at:at + n] = rewards[d]
            at += n
        return text, label, segment, reward

    def files(self) -> list[MMapIndexedDataset]:
        return [self.tokens] + ([self.labels] if self.labels is not None else [])


class _WholeDocuments(torch.utils.data.Dataset):
    """Shared by both datasets: which documents each sample holds, and the checks."""

    def __init__(self, name: str, data_prefix: str, documents: np.ndarray, lengths: np.ndarray,
                 keep: np.ndarray | None, num_samples: int, seq_length: int, seed: int,
                 pack_impl: str, allow_chopped: bool, pad_id: int):
        self.name, self.data_prefix = name, str(data_prefix)
        self.seq_length, self.pad_id = int(seq_length), int(pad_id)
        self.num_samples = int(num_samples)
        start = time.perf_counter()
        self.samples = pack_documents(lengths, documents, seq_length, num_samples, seed,
                                      pack_impl, allow_chopped, keep)
        if self.samples.eligible == 0:  # A9
            reasons = ["empty"]
            if not allow_chopped:
                reasons.append(f"longer than seq_length + 1 = {seq_length + 1} tokens "
                               "(allow_chopped is false)")
            if keep is not None:
                reasons.append("without a label that carries loss")
            raise ValueError(f"dataset {name!r} of {self.data_prefix}: none of its "
                             f"{len(documents)} documents can make a sample (each is "
                             f"{' or '.join(reasons)}); check the data and its label files")
        logger.info("dataset %s (%s): %d of %d documents usable, %s, %d samples requested -> "
                    "%d epoch(s), %d samples of %d tokens (built in %.2f s)", name,
                    self.data_prefix, self.samples.eligible, len(documents), pack_impl,
                    num_samples, self.samples.epochs, len(self.samples), seq_length + 1,
                    time.perf_counter() - start)

    def __len__(self) -> int:
        return len(self.samples)

    def _documents(self, idx: int) -> np.ndarray:
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"sample {idx} out of range for dataset {self.name!r} of {n} samples")
        return self.samples.documents_of(idx % n)


class DocumentDataset(_WholeDocuments):
    """Samples of whole documents of one token file, with its label and reward files."""

    def __init__(self, name: str, data_prefix: str, documents: np.ndarray,
                 tokens: MMapIndexedDataset, num_samples: int, seq_length: int, seed: int,
                 pack_impl: str, allow_chopped: bool = True,
                 labels: MMapIndexedDataset | None = None, rewards: np.ndarray | None = None,
                 pad_id: int = 0):
        self.side = _Side(tokens, labels)
        self.rewards = rewards
        keep = supervised_documents(labels, seq_length) if labels is not None else None
        super().__init__(name, data_prefix, documents, tokens.sizes, keep, num_samples,
                         seq_length, seed, pack_impl, allow_chopped, pad_id)

    def indexed_datasets(self) -> list[MMapIndexedDataset]:
        return self.side.files()

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        text, label, segment, reward = self.side.fill(self._documents(idx), self.seq_length + 1,
                                                      self.pad_id, self.rewards)
        sample = {"text": text, "label": label, "segment": segment}
        if reward is not None:
            sample["reward"] = reward
        return sample


class PairwiseDataset(_WholeDocuments):
    """Samples of chosen/rejected pairs: document i of `pos` with document i of `neg`."""

    def __init__(self, name: str, data_prefix: str, documents: np.ndarray,
                 pos: MMapIndexedDataset, neg: MMapIndexedDataset, num_samples: int,
                 seq_length: int, seed: int, pack_impl: str, allow_chopped: bool = True,
                 pos_labels: MMapIndexedDataset | None = None,
                 neg_labels: MMapIndexedDataset | None = None, pad_id: int = 0):
        self.pos, self.neg = _Side(pos, pos_labels), _Side(neg, neg_labels)
        keep = None
        if pos_labels is not None and neg_labels is not None:
            keep = (supervised_documents(pos_labels, seq_length)
                    & supervised_documents(neg_labels, seq_length))
        lengths = np.maximum(pos.sizes, neg.sizes)
        super().__init__(name, data_prefix, documents, lengths, keep, num_samples, seq_length,
                         seed, pack_impl, allow_chopped, pad_id)

    def indexed_datasets(self) -> list[MMapIndexedDataset]:
        return self.pos.files() + self.neg.files()

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        docs = self._documents(idx)
        sample = {}
        for key, side in (("pos", self.pos), ("neg", self.neg)):
            text, label, segment, _ = side.fill(docs, self.seq_length + 1, self.pad_id, None)
            sample.update({key: text, f"{key}_label": label, f"{key}_segment": segment})
        return sample
