"""A split's documents and how many samples they give, from the index files alone (numpy, no
torch): what the workers build their datasets from, and what deepy.py checks before any worker
starts (check_split_sizes: every split asked for samples gives at least one global batch, A9).
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple, Sequence

import numpy as np

from megatron.data import sample_index
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.options import SampleOptions
from megatron.data.splits import SPLIT_NAMES, split_document_ranges
from megatron.monitoring.logger import get_logger

logger = get_logger(__name__)


class Part(NamedTuple):
    """One dataset inside a split: its token file and the files that go with it ("label",
    "reward"; for pairs "neg", "pos_label" and "neg_label", the token file being the chosen
    side)."""

    name: str
    prefix: str
    documents: np.ndarray
    files: dict = {}


def parts_per_split(data_path, paths, weights, split, weight_by_num_documents, open_prefix,
                    side_files=None, warn: bool = True):
    """[(parts, weights)] for train, valid and test, before any weight_by_num_documents; `warn`
    logs the weights that are ignored."""
    if data_path and any(paths):
        raise ValueError("give either data_path or train/valid/test_data_paths, not both")
    if data_path:
        if warn and any(w is not None for w in weights):
            logger.warning("train/valid/test_data_weights are ignored with data_path; they "
                           "apply to train/valid/test_data_paths")
        prefixes = [data_path] if isinstance(data_path, (str, os.PathLike)) else list(data_path)
        out: list[tuple[list[Part], list[float]]] = [([], []) for _ in SPLIT_NAMES]
        for i, prefix in enumerate(map(str, prefixes)):
            dataset = open_prefix(prefix)
            ranges = split_document_ranges(split, len(dataset))
            for s, name in enumerate(SPLIT_NAMES):
                docs = np.arange(ranges[name].start, ranges[name].stop, dtype=np.int64)
                if len(docs):  # parts of one split blend in proportion to their tokens
                    part_name = f"{name}_{i}" if len(prefixes) > 1 else name
                    out[s][0].append(Part(part_name, prefix, docs))
                    out[s][1].append(float(dataset.sizes[docs].sum(dtype=np.int64)))
        return out
    if not any(paths):
        raise ValueError("no data given: set data_path, or train_data_paths (and optionally "
                         "valid_data_paths / test_data_paths)")
    out = []
    for name, split_paths, split_weights in zip(SPLIT_NAMES, paths, weights):
        split_paths = [str(p) for p in split_paths or []]
        if warn and split_weights is not None and weight_by_num_documents:
            logger.warning("%s_data_weights are ignored: weight_by_num_documents derives the "
                           "weights from document counts", name)
        s = SPLIT_NAMES.index(name)
        parts = [Part(f"{name}_{i}" if len(split_paths) > 1 else name, p,
                       np.arange(len(open_prefix(p)), dtype=np.int64),
                       {kind: str(triple[s][i]) for kind, triple in (side_files or {}).items()
                        if triple[s] is not None})
                 for i, p in enumerate(split_paths)]
        out.append((parts, list(split_weights) if split_weights is not None
                    else [1.0] * len(parts)))
    return out


def check_split_size(name: str, parts: Sequence[Part], open_prefix, seq_length: int,
                     num_samples: int, global_batch_size: int | None,
                     log_epochs: bool = True) -> None:
    """Log the epochs `num_samples` need; refuse a split whose documents give fewer samples per
    epoch than one global batch (A9), since repeating it would put a sample twice in a batch.

    Each part is its own token stream, so the split's samples per epoch are the sum of its
    parts'.
    """
    tokens = samples = 0
    for part in parts:
        part_tokens = sample_index.tokens_per_epoch(open_prefix(part.prefix).sizes,
                                                    part.documents)
        tokens += part_tokens
        samples += sample_index.samples_per_epoch(part_tokens, seq_length)
    if global_batch_size is not None and samples < global_batch_size:
        raise ValueError(
            f"the {name} split holds {tokens} tokens ({samples} sample{'s' * (samples != 1)} of "
            f"seq_length + 1 = {seq_length + 1} tokens), fewer than one global batch of "
            f"{global_batch_size} samples; give the {name} split more data (data paths or split) "
            "or lower the global batch (train_micro_batch_size_per_gpu x "
            "gradient_accumulation_steps x data-parallel size) or seq_length"
        )
    if not log_epochs:
        return
    # one dataset's own line says the same; a blend's total is worth a line of its own
    logger.log(logging.INFO if len(parts) > 1 else logging.DEBUG,
               "%s split: %d tokens = %d samples per epoch; %d samples requested -> %.2f "
               "epochs", name, tokens, samples, num_samples,
               num_samples / samples if samples else float("inf"))


def check_split_sizes(*, data_path, train_data_paths, valid_data_paths, test_data_paths,
                      train_data_weights, valid_data_weights, test_data_weights,
                      weight_by_num_documents: bool, split: str, seq_length: int,
                      train_valid_test_num_samples: Sequence[int], global_batch_size: int,
                      options: SampleOptions) -> None:
    """What the workers' dataset building refuses about the data's size (check_split_size),
    decided from the index files before any worker starts; quiet otherwise (the workers log the
    epochs)."""
    opened: dict[str, MMapIndexedDataset] = {}

    def open_prefix(prefix: str) -> MMapIndexedDataset:
        if prefix not in opened:
            opened[prefix] = MMapIndexedDataset(prefix)
        return opened[prefix]

    per_split = parts_per_split(
        data_path, [train_data_paths, valid_data_paths, test_data_paths],
        [train_data_weights, valid_data_weights, test_data_weights], split,
        weight_by_num_documents, open_prefix, options.side_files, warn=False)
    for name, n, (parts, weights) in zip(SPLIT_NAMES, train_valid_test_num_samples, per_split):
        if name == "train" and n and not sum(len(p.documents) for p in parts):
            given = (f"data_path {data_path} with split {split!r}" if data_path
                     else f"train_data_paths {train_data_paths}")
            raise ValueError(f"the train split holds no documents ({given}), but training "
                             f"needs {n} samples: give it data (its data paths, or a split "
                             "whose first proportion is not 0)")
        if n == 0 or not parts or options.pack_impl != "packed":
            continue
        if not weight_by_num_documents:  # parts weighted 0 are not read
            parts = [p for p, w in zip(parts, weights) if w != 0] or parts
        check_split_size(name, parts, open_prefix, seq_length, n, global_batch_size,
                         log_epochs=False)
