"""Shared fixtures for the data tests: small token files written on the fly.

Helpers are handed out as fixtures (not imported) so the tests work under any pytest import mode.
"""

from __future__ import annotations

import numpy as np
import pytest

from megatron.data.indexed_dataset import (MMapIndexedDataset, MMapIndexedDatasetBuilder,
                                           data_file_path, index_file_path)


def _write_dataset(prefix, documents, dtype=np.uint16) -> MMapIndexedDataset:
    """Write one item per document at `prefix` and open it."""
    builder = MMapIndexedDatasetBuilder(data_file_path(str(prefix)), dtype=dtype)
    for doc in documents:
        builder.add_item(np.asarray(doc, dtype=np.int64))
        builder.end_document()
    builder.finalize(index_file_path(str(prefix)))
    return MMapIndexedDataset(str(prefix))


def _random_documents(n, max_len=40, vocab=1000, seed=0, min_len=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(min_len, max_len + 1)))
            for _ in range(n)]


@pytest.fixture
def write_dataset():
    """write_dataset(prefix, documents, dtype=np.uint16) -> opened MMapIndexedDataset."""
    return _write_dataset


@pytest.fixture
def random_documents():
    """random_documents(n, max_len=40, vocab=1000, seed=0, min_len=0) -> list of int arrays."""
    return _random_documents


@pytest.fixture
def small_dataset(tmp_path):
    """(prefix, documents, dataset): 60 documents of 0..40 tokens, some empty."""
    docs = _random_documents(60)
    prefix = str(tmp_path / "small")
    return prefix, docs, _write_dataset(prefix, docs)
