"""`GPT2Dataset`: fixed-length language-model samples read across document boundaries.

Sample i is `seq_length + 1` consecutive tokens of the shuffled document stream (see
`sample_index`). The three indices are cached as `.npy` files whose names carry a hash of
everything they depend on (A11): the index file's sha256 (which fixes every document size), the
split's documents, `num_samples`, `seq_length`, `seed` and the index format version. Loaded
files are checked for shape, dtype and bounds and rebuilt when stale; they are written to
temporary names and renamed, so a reader never sees half a file.

Under `torch.distributed`, rank 0 of the group builds and saves while the other ranks wait at a
barrier and then load, so every rank of the group must construct the dataset. A rank that cannot
see rank 0's files (no shared filesystem) builds its own copy, which is identical.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from typing import Any

import numpy as np
import torch

from megatron.data import sample_index
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.monitoring.logger import get_logger
from megatron.monitoring.progress import progress

logger = get_logger(__name__)

INDEX_FORMAT_VERSION = 1
_KINDS = ("doc", "sample", "shuffle")


class GPT2Dataset(torch.utils.data.Dataset):
    """Samples `{"text": int64[seq_length + 1]}` from `documents` of `indexed_dataset`, and
    `"label"` the same positions of the label file `labels` when there is one.

    `documents` are item numbers of the indexed dataset (one item per document in files from
    `preprocess_data.py`). `len(self)` is every sample the epochs hold, at least `num_samples`.
    `index_built` tells whether this object built its indices (True) or loaded them (False).
    """

    def __init__(self, name: str, data_prefix: str, documents: np.ndarray,
                 indexed_dataset: MMapIndexedDataset, num_samples: int, seq_length: int,
                 seed: int, cache_dir: str | None = None, build_index_mappings: bool = True,
                 group: Any = None, labels: MMapIndexedDataset | None = None):
        self.name = name
        self.data_prefix = str(data_prefix)
        self.indexed_dataset = indexed_dataset
        self.labels = labels  # a label file (megatron.data.aligned), read like the tokens
        self.documents = np.asarray(documents, dtype=np.int64)
        self.num_samples, self.seq_length, self.seed = int(num_samples), int(seq_length), int(seed)
        self.cache_dir = cache_dir if cache_dir is not None else os.path.dirname(
            os.path.abspath(self.data_prefix))
        self.index_built = False
        self.doc_idx = self.sample_idx = self.shuffle_idx = None
        self._check_arguments()
        if build_index_mappings:
            self._prepare_indices(group)

    # -- checks and logging --------------------------------------------------------------------
    def _check_arguments(self) -> None:
        n = len(self.indexed_dataset)
        if self.num_samples < 1 or self.seq_length < 1:
            raise ValueError(f"dataset {self.name!r}: num_samples ({self.num_samples}) and "
                             f"seq_length ({self.seq_length}) must be >= 1")
        if len(self.documents) == 0:
            raise ValueError(f"dataset {self.name!r} of {self.data_prefix} has no documents; "
                             "give the split a larger share or use more data")
        if self.documents.min() < 0 or self.documents.max() >= n:
            raise ValueError(f"dataset {self.name!r}: documents must be item numbers in "
                             f"0..{n - 1} of {self.data_prefix}")
        per_epoch = sample_index.tokens_per_epoch(self.indexed_dataset.sizes, self.documents)
        if sample_index.samples_per_epoch(per_epoch, self.seq_length) < 1:  # A9
            raise ValueError(
                f"dataset {self.name!r} of {self.data_prefix}: its {len(self.documents)} "
                f"documents hold {per_epoch} tokens, fewer than one sample of seq_length + 1 = "
                f"{self.seq_length + 1}; give this split more documents (split=...) or lower "
                "seq_length"
            )

    def _log_epochs(self, epochs: int) -> None:
        per_epoch = sample_index.tokens_per_epoch(self.indexed_dataset.sizes, self.documents)
        logger.info(
            "dataset %s (%s): %d documents, %d tokens/epoch, %d samples of %d tokens requested "
            "-> %d epoch(s), %d samples available", self.name, self.data_prefix,
            len(self.documents), per_epoch, self.num_samples, self.seq_length + 1, epochs,
            len(self))

    # -- cache -----------------------------------------------------------------------------------
    def cache_key(self) -> str:
        """Short hash of everything the indices depend on (A11)."""
        payload = {
            "format": INDEX_FORMAT_VERSION,
            "idx_sha256": self.indexed_dataset.opened_fingerprint["idx_sha256"],
            "documents": hashlib.sha256(self.documents.tobytes()).hexdigest(),
            "num_samples": self.num_samples,
            "seq_length": self.seq_length,
            "seed": self.seed,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]

    def cache_paths(self) -> dict[str, str]:
        """The `.npy` file for each index kind ("doc", "sample", "shuffle")."""
        stem = (f"{os.path.basename(self.data_prefix)}_{self.name}_indexmap_{self.num_samples}ns"
                f"_{self.seq_length}sl_{self.seed}s_{self.cache_key()}")
        return {k: os.path.join(self.cache_dir, f"{stem}_{k}_idx.npy") for k in _KINDS}

    def _load_cached(self, paths: dict[str, str]) -> bool:
        if not all(os.path.isfile(p) for p in paths.values()):
            return False
        try:
            arrays = [np.load(paths[k], mmap_mode="r", allow_pickle=False) for k in _KINDS]
        except (OSError, ValueError) as err:
            logger.warning("index cache %s unreadable (%s); rebuilding", paths["doc"], err)
            return False
        problem = sample_index.check_indices(*arrays, self.documents, self.indexed_dataset.sizes,
                                             self.seq_length, self.num_samples)
        if problem:
            logger.warning("index cache %s is stale (%s); rebuilding", paths["doc"], problem)
            return False
        self.doc_idx, self.sample_idx, self.shuffle_idx = arrays
        return True

    def _build_and_save(self, paths: dict[str, str]) -> int:
        start = time.perf_counter()
        bar = progress(total=1 + len(_KINDS), desc=f"{self.name} indices", unit="step")
        doc_idx, sample_idx, shuffle_idx, epochs = sample_index.build_indices(
            self.indexed_dataset.sizes, self.documents, self.seq_length, self.num_samples,
            self.seed)
        bar.update()
        self.doc_idx, self.sample_idx, self.shuffle_idx = doc_idx, sample_idx, shuffle_idx
        self.index_built = True
        took = time.perf_counter() - start
        logger.log(logging.INFO if took > 1.0 else logging.DEBUG, "built %s indices in %.3f s",
                   self.name, took)
        try:
            os.makedirs(self.cache_dir, exist_ok=True)
            for kind, array in zip(_KINDS, (doc_idx, sample_idx, shuffle_idx)):
                _save_atomic(paths[kind], array)
                bar.update()
        except OSError as err:
            logger.warning("cannot write index cache in %s (%s); keeping the indices in memory",
                           self.cache_dir, err)
        finally:
            bar.close()
        return epochs

    def _prepare_indices(self, group: Any) -> None:
        paths = self.cache_paths()
        dist = torch.distributed
        distributed = dist.is_available() and dist.is_initialized()
        leader = not distributed or dist.get_rank(group) == 0
        if leader and not self._load_cached(paths):
            self._build_and_save(paths)
        if distributed:
            dist.barrier(group=group)
            if not leader and not self._load_cached(paths):
                logger.warning("rank %d cannot load the index cache rank 0 wrote in %s (not a "
                               "shared filesystem?); building it here", dist.get_rank(),
                               self.cache_dir)
                self._build_and_save(paths)
        per_epoch = sample_index.tokens_per_epoch(self.indexed_dataset.sizes, self.documents)
        self._log_epochs(sample_index.num_epochs(per_epoch, self.seq_length, self.num_samples))

    # -- access ----------------------------------------------------------------------------------
    def indexed_datasets(self) -> list[MMapIndexedDataset]:
        """The token file this dataset reads, and its label file (for fingerprints, A17)."""
        return [self.indexed_dataset] + ([self.labels] if self.labels is not None else [])

    def __len__(self) -> int:
        if self.shuffle_idx is None:
            raise RuntimeError(f"dataset {self.name!r} was created with build_index_mappings="
                               "False and has no samples")
        return int(self.shuffle_idx.shape[0])

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"sample {idx} out of range for dataset {self.name!r} of {n} samples")
        i = int(self.shuffle_idx[idx])
        sample = {"text": self._read(self.indexed_dataset, i)}
        if self.labels is not None:
            sample["label"] = self._read(self.labels, i)
        return sample

    def _read(self, indexed: MMapIndexedDataset, i: int) -> np.ndarray:
        """Sample i (unshuffled) of `indexed`: the token file or its label file."""
        (first, start), (last, end) = self.sample_idx[i], self.sample_idx[i + 1]
        get = indexed.get
        if first == last:
            parts = [get(self.doc_idx[first], offset=int(start), length=int(end - start + 1))]
        else:
            parts = [get(self.doc_idx[first], offset=int(start))]
            parts += [get(self.doc_idx[j]) for j in range(first + 1, last)]
            parts.append(get(self.doc_idx[last], length=int(end + 1)))
        return np.concatenate(parts).astype(np.int64)


def _save_atomic(path: str, array: np.ndarray) -> None:
    tmp = f"{path}.tmp-{os.getpid()}.npy"
    try:
        np.save(tmp, np.ascontiguousarray(array), allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
