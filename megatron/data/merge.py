"""Concatenating indexed datasets into one (`tools/datasets/merge_datasets.py`)."""

from __future__ import annotations

import glob
import os

from megatron.data.indexed_dataset import (MMapIndexedDataset, MMapIndexedDatasetBuilder,
                                           data_file_path, index_file_path)
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)


def expand_prefixes(inputs: list[str]) -> list[str]:
    """Dataset prefixes from prefixes or directories (every `*.idx` inside, sorted)."""
    prefixes = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(p[: -len(".idx")] for p in glob.glob(os.path.join(item, "*.idx")))
            if not found:
                raise FileNotFoundError(f"directory {item} holds no .idx/.bin datasets")
            prefixes.extend(found)
        else:
            prefixes.append(item)
    if not prefixes:
        raise ValueError("no datasets to merge: give at least one prefix or directory")
    return prefixes


def merge_datasets(inputs: list[str], output_prefix: str) -> MMapIndexedDataset:
    """Write `output_prefix.{bin,idx}` holding every document of `inputs`, in order.

    All inputs must share one token dtype; each is opened (and so validated, A16) first, and
    the output appears only when complete (the builder writes to temporary names).
    """
    prefixes = expand_prefixes(inputs)
    opened = [MMapIndexedDataset(p) for p in prefixes]  # validates every pair before writing
    dtypes = {ds.dtype for ds in opened}
    if len(dtypes) > 1:
        listing = ", ".join(f"{p} ({ds.dtype.__name__})" for p, ds in zip(prefixes, opened))
        raise ValueError(f"cannot merge datasets of different token dtypes: {listing}; "
                         "re-tokenize them with one tokenizer")
    if os.path.abspath(output_prefix) in {os.path.abspath(p) for p in prefixes}:
        raise ValueError(f"output prefix {output_prefix} is one of the inputs; choose another")
    builder = MMapIndexedDatasetBuilder(data_file_path(output_prefix), dtype=opened[0].dtype)
    for prefix in prefixes:
        builder.merge_file_(prefix)
    builder.finalize(index_file_path(output_prefix))
    merged = MMapIndexedDataset(output_prefix)
    log.info("merged %d datasets into %s: %d documents, %d tokens", len(prefixes),
             output_prefix, len(merged.doc_idx) - 1, int(merged.sizes.sum()))
    return merged
