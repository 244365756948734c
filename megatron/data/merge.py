"""Concatenating indexed datasets into one (`tools/datasets/merge_datasets.py`)."""

from __future__ import annotations

import glob
import os

from megatron.data.indexed_dataset import (MMapIndexedDataset, MMapIndexedDatasetBuilder,
                                           data_file_path, index_file_path)
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)


# the files post-training data keeps beside its tokens (megatron.data.chat_preprocess)
SIDE_FILE_ENDINGS = ("_label_document", "_reward_document")


def expand_prefixes(inputs: list[str]) -> list[str]:
    """Dataset prefixes from prefixes or directories (every `*.idx` inside, sorted); a
    directory holding label or reward files beside token files is refused, since merging
    them all would put labels among the tokens."""
    prefixes = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(p[: -len(".idx")] for p in glob.glob(os.path.join(item, "*.idx")))
            if not found:
                raise FileNotFoundError(f"directory {item} holds no .idx/.bin datasets")
            side = [p for p in found if p.endswith(SIDE_FILE_ENDINGS)]
            if side and len(side) < len(found):
                tokens = [p for p in found if p not in side]
                raise ValueError(
                    f"directory {item} holds label or reward files ({_names(side)}) beside "
                    f"token files ({_names(tokens)}): merged as one they would put labels "
                    "among the tokens; merge each kind on its own, naming its prefixes "
                    "(--datasets PREFIX ... --output-prefix OUT, then the label files' "
                    "prefixes to OUT's label prefix)")
            prefixes.extend(found)
        else:
            prefixes.append(item)
    if not prefixes:
        raise ValueError("no datasets to merge: give at least one prefix or directory")
    return prefixes


def _names(prefixes: list[str], most: int = 3) -> str:
    names = [os.path.basename(p) for p in prefixes]
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


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
