"""GPT2Dataset: sample contents against a brute-force reference, epochs, and the index cache."""

from __future__ import annotations

import logging
import os
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from megatron.data import sample_index
from megatron.data.gpt2_dataset import GPT2Dataset
from megatron.data.indexed_dataset import MMapIndexedDataset


def neox_sample_idx(sizes, doc_idx, seq_length, num_samples):
    """GPT-NeoX's C++ build_sample_idx, transcribed as a plain Python loop."""
    out = [(0, 0)]
    index, offset = 0, 0
    for _ in range(num_samples):
        remaining = seq_length + 1
        while remaining != 0:
            length = sizes[doc_idx[index]] - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                index += 1
                offset = 0
        out.append((index, offset))
    return np.array(out)


def make(prefix, ds, documents, num_samples=50, seq_length=16, seed=7, **kw):
    return GPT2Dataset("train", prefix, documents, ds, num_samples, seq_length, seed, **kw)


@pytest.mark.parametrize("seq_length, num_samples", [(16, 50), (5, 400), (63, 90)])
def test_samples_match_a_brute_force_stream(small_dataset, seq_length, num_samples):
    prefix, docs, ds = small_dataset
    documents = np.arange(10, 50)
    data = make(prefix, ds, documents, num_samples, seq_length)
    assert len(data) >= num_samples
    stream = np.concatenate([docs[d] for d in data.doc_idx])
    for j in range(len(data)):
        i = int(data.shuffle_idx[j])
        expected = stream[i * seq_length: i * seq_length + seq_length + 1]
        sample = data[j]["text"]
        assert sample.dtype == np.int64 and sample.shape == (seq_length + 1,)
        assert np.array_equal(sample, expected), j
    # The unshuffled samples tile the stream, overlapping by one token.
    assert len(stream) - 1 >= len(data) * seq_length
    with pytest.raises(IndexError):
        data[len(data)]


def test_indices_replay_gpt_neox(small_dataset):
    prefix, docs, ds = small_dataset
    documents = np.arange(0, 60)
    data = make(prefix, ds, documents, num_samples=300, seq_length=20, seed=1234)
    rng = np.random.RandomState(seed=1234)
    epochs = sample_index.num_epochs(int(ds.sizes.sum()), 20, 300)
    doc_idx = np.mgrid[0:epochs, 0:len(documents)][1]
    doc_idx[:] = documents
    doc_idx = doc_idx.reshape(-1).astype(np.int32)
    rng.shuffle(doc_idx)
    assert np.array_equal(data.doc_idx, doc_idx)
    n = len(data)
    reference = neox_sample_idx(ds.sizes, doc_idx, 20, n)
    assert np.array_equal(_positions(data.sample_idx, ds.sizes, doc_idx),
                          _positions(reference, ds.sizes, doc_idx))
    shuffle = np.arange(n, dtype=np.uint32)
    rng.shuffle(shuffle)
    assert np.array_equal(data.shuffle_idx, shuffle)


def _positions(sample_idx, sizes, doc_idx):
    """Stream position of each (doc_idx index, offset) row."""
    starts = np.concatenate([[0], np.cumsum(sizes[doc_idx])])
    return starts[sample_idx[:, 0]] + sample_idx[:, 1]


def test_epochs_cover_the_requested_samples(small_dataset, caplog):
    prefix, docs, ds = small_dataset
    documents = np.arange(0, 20)
    tokens = int(ds.sizes[documents].sum())
    num_samples = 3 * tokens // 10
    with caplog.at_level(logging.INFO, logger="megatron"):
        data = make(prefix, ds, documents, num_samples=num_samples, seq_length=10)
    epochs = len(data.doc_idx) // len(documents)
    assert epochs == sample_index.num_epochs(tokens, 10, num_samples) >= 3
    assert (epochs * tokens - 1) // 10 >= num_samples > ((epochs - 1) * tokens - 1) // 10
    assert np.array_equal(np.bincount(data.doc_idx, minlength=20)[:20], np.full(20, epochs))
    assert f"-> {epochs} epoch(s)" in caplog.text


def test_split_too_small_for_one_sample_is_an_error(small_dataset):
    prefix, docs, ds = small_dataset
    documents = np.array([i for i, d in enumerate(docs) if len(d)][:2])
    tokens = int(ds.sizes[documents].sum())
    with pytest.raises(ValueError, match=f"hold {tokens} tokens, fewer than one sample"):
        make(prefix, ds, documents, seq_length=tokens)


def _mtimes(paths):
    return {k: os.stat(p).st_mtime_ns for k, p in paths.items()}


def test_cache_is_reused_and_invalidated(tmp_path, small_dataset, write_dataset):
    prefix, docs, ds = small_dataset
    cache = str(tmp_path / "cache")
    docs_range = np.arange(0, 50)
    first = make(prefix, ds, docs_range, cache_dir=cache)
    paths = first.cache_paths()
    assert first.index_built and all(os.path.isfile(p) for p in paths.values())
    before = _mtimes(paths)

    again = make(prefix, ds, docs_range, cache_dir=cache)
    assert not again.index_built and _mtimes(paths) == before
    assert np.array_equal(again[3]["text"], first[3]["text"])

    for changed in (dict(seq_length=17), dict(seed=8), dict(num_samples=51)):
        other = make(prefix, ds, docs_range, cache_dir=cache, **changed)
        assert other.index_built and other.cache_paths()["doc"] != paths["doc"]
    assert make(prefix, ds, np.arange(0, 49), cache_dir=cache).index_built

    # Different data under the same prefix: new sizes, new key.
    new_ds = write_dataset(prefix, docs[::-1])
    rebuilt = make(prefix, new_ds, docs_range, cache_dir=cache)
    assert rebuilt.index_built and rebuilt.cache_paths()["doc"] != paths["doc"]


def test_stale_cache_files_are_rebuilt(tmp_path, small_dataset, caplog):
    prefix, docs, ds = small_dataset
    cache = str(tmp_path / "cache")
    first = make(prefix, ds, np.arange(0, 50), cache_dir=cache)
    paths = first.cache_paths()
    np.save(paths["shuffle"], np.arange(3))
    with caplog.at_level(logging.WARNING, logger="megatron"):
        second = make(prefix, ds, np.arange(0, 50), cache_dir=cache)
    assert second.index_built and "stale (shuffle_idx has shape (3,)" in caplog.text
    assert np.array_equal(np.load(paths["shuffle"]), first.shuffle_idx)
    with open(paths["doc"], "wb") as f:
        f.write(b"garbage")
    assert make(prefix, ds, np.arange(0, 50), cache_dir=cache).index_built


def test_default_cache_dir_is_beside_the_data(small_dataset):
    prefix, docs, ds = small_dataset
    data = make(prefix, ds, np.arange(0, 50))
    assert os.path.dirname(data.cache_paths()["doc"]) == os.path.dirname(prefix)
    name = os.path.basename(data.cache_paths()["doc"])
    assert name.startswith("small_train_indexmap_50ns_16sl_7s_") and name.endswith("_doc_idx.npy")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _distributed_worker(rank, world, port, prefix, cache, out):
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=world)
    try:
        ds = MMapIndexedDataset(prefix)
        data = GPT2Dataset("train", prefix, np.arange(0, 50), ds, 50, 16, 7, cache_dir=cache)
        np.save(os.path.join(out, f"rank{rank}.npy"),
                np.stack([data[i]["text"] for i in range(len(data))]))
        with open(os.path.join(out, f"rank{rank}.built"), "w") as f:
            f.write(str(data.index_built))
    finally:
        torch.distributed.destroy_process_group()


def test_rank_zero_builds_and_the_other_rank_loads(tmp_path, small_dataset):
    prefix, docs, ds = small_dataset
    cache, out = str(tmp_path / "cache"), str(tmp_path)
    mp.spawn(_distributed_worker, args=(2, _free_port(), prefix, cache, out), nprocs=2)
    built = []
    for r in range(2):
        with open(os.path.join(out, f"rank{r}.built")) as f:
            built.append(f.read())
    assert built == ["True", "False"]
    single = make(prefix, ds, np.arange(0, 50), cache_dir=str(tmp_path / "single"))
    reference = np.stack([single[i]["text"] for i in range(len(single))])
    for r in range(2):
        assert np.array_equal(np.load(os.path.join(out, f"rank{r}.npy")), reference)
