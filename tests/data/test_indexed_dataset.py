"""The .bin/.idx format: bytes on disk, round trips, and every check the reader and writer make."""

from __future__ import annotations

import hashlib
import os
import pickle
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron.data.indexed_dataset import (MMapIndexedDataset, MMapIndexedDatasetBuilder,
                                           TokenFileChanged, best_fitting_dtype, data_file_path,
                                           index_file_path, make_builder, make_dataset)

ROOT = Path(__file__).resolve().parents[2]


def hand_made_index(sizes, doc_idx, code, itemsize):
    """The .idx bytes built field by field from the layout documented in indexed_dataset.py."""
    out = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code)
    out += struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(doc_idx))
    out += b"".join(struct.pack("<i", s) for s in sizes)
    pointer = 0
    for s in sizes:
        out += struct.pack("<q", pointer)
        pointer += s * itemsize
    out += b"".join(struct.pack("<q", d) for d in doc_idx)
    return out


def test_written_bytes_match_the_documented_layout(tmp_path):
    prefix = str(tmp_path / "x")
    builder = MMapIndexedDatasetBuilder(data_file_path(prefix), dtype=np.uint16)
    builder.add_item([1, 2, 3])
    builder.add_item(np.array([65535], dtype=np.int64))
    builder.end_document()
    builder.add_item(torch.tensor([7, 8]))
    builder.end_document()
    builder.finalize(index_file_path(prefix))

    with open(index_file_path(prefix), "rb") as f:
        assert f.read() == hand_made_index([3, 1, 2], [0, 2, 3], code=8, itemsize=2)
    with open(data_file_path(prefix), "rb") as f:
        assert f.read() == struct.pack("<6H", 1, 2, 3, 65535, 7, 8)


def test_reader_reads_hand_made_int32_files(tmp_path):
    prefix = str(tmp_path / "hand")
    with open(index_file_path(prefix), "wb") as f:
        f.write(hand_made_index([2, 0, 3], [0, 1, 3], code=4, itemsize=4))
    with open(data_file_path(prefix), "wb") as f:
        f.write(struct.pack("<5i", 100000, 5, 9, 8, 7))
    ds = MMapIndexedDataset(prefix)
    assert ds.dtype == np.int32 and len(ds) == 3
    assert ds[0].tolist() == [100000, 5] and ds[1].tolist() == [] and ds[2].tolist() == [9, 8, 7]
    assert ds.sizes.tolist() == [2, 0, 3] and ds.doc_idx.tolist() == [0, 1, 3]
    assert ds.pointers.tolist() == [0, 8, 8]


def test_round_trip_items_slices_and_get(small_dataset):
    prefix, docs, ds = small_dataset
    assert len(ds) == len(docs)
    for i, doc in enumerate(docs):
        assert ds[i].tolist() == doc.tolist()
    assert ds[-1].tolist() == docs[-1].tolist()
    assert [a.tolist() for a in ds[5:9]] == [d.tolist() for d in docs[5:9]]
    assert ds[3:3] == []
    long_doc = next(i for i, d in enumerate(docs) if len(d) > 10)
    assert ds.get(long_doc, offset=2, length=5).tolist() == docs[long_doc][2:7].tolist()
    assert ds.get(long_doc, offset=4).tolist() == docs[long_doc][4:].tolist()
    assert ds.doc_idx.tolist() == list(range(len(docs) + 1))
    assert ds.num_tokens == sum(len(d) for d in docs)
    with pytest.raises(IndexError, match="out of range"):
        ds[len(docs)]
    with pytest.raises(IndexError, match="out of range"):
        ds.get(long_doc, offset=0, length=len(docs[long_doc]) + 1)
    with pytest.raises(ValueError, match="contiguous"):
        ds[0:10:2]


def test_pickled_reader_reopens_the_files(small_dataset):
    prefix, docs, ds = small_dataset
    clone = pickle.loads(pickle.dumps(ds))
    assert clone[7].tolist() == docs[7].tolist()
    assert clone.opened_fingerprint == ds.opened_fingerprint  # carried, not hashed again
    assert make_dataset(prefix)[7].tolist() == docs[7].tolist()


def test_missing_partner_names_both_paths(small_dataset):
    prefix, _, _ = small_dataset
    os.remove(data_file_path(prefix))
    with pytest.raises(FileNotFoundError) as err:
        MMapIndexedDataset(prefix)
    message = str(err.value)
    assert index_file_path(prefix) in message and data_file_path(prefix) in message
    assert "missing: " + data_file_path(prefix) in message


def test_a_missing_pair_says_what_was_meant_and_where_it_was_looked_for(tmp_path, monkeypatch):
    prefix = str(tmp_path / "corpus_text_document")
    builder = MMapIndexedDatasetBuilder(data_file_path(prefix), dtype=np.uint16)
    builder.add_item([1, 2])
    builder.end_document()
    builder.finalize(index_file_path(prefix))
    with pytest.raises(FileNotFoundError) as err:  # the prefix given with its extension
        MMapIndexedDataset(prefix + ".bin")
    assert str(err.value).endswith(f"Did you mean {prefix!r}? Give the prefix, without .bin or "
                                   ".idx.")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as err:  # relative to another working directory
        MMapIndexedDataset("data/builtin/builtin_text_document")
    assert (f"(relative paths start at the working directory, {tmp_path}) Make the built-in "
            "dataset with python tools/datasets/prepare_data.py builtin -d data") in str(err.value)


def test_truncated_bin_is_refused_with_expected_and_found_sizes(small_dataset):
    prefix, docs, _ = small_dataset
    size = os.path.getsize(data_file_path(prefix))
    with open(data_file_path(prefix), "r+b") as f:
        f.truncate(size - 2)
    with pytest.raises(ValueError) as err:
        MMapIndexedDataset(prefix)
    message = str(err.value)
    assert data_file_path(prefix) in message and "truncated" in message
    assert f"= {size} bytes, found {size - 2} bytes" in message


def test_extra_bytes_in_bin_are_refused(small_dataset):
    prefix, _, _ = small_dataset
    with open(data_file_path(prefix), "ab") as f:
        f.write(b"\x00\x00")
    with pytest.raises(ValueError, match="longer than its index"):
        MMapIndexedDataset(prefix)


def test_mismatched_pair_is_refused(tmp_path, write_dataset):
    write_dataset(tmp_path / "a", [[1, 2, 3], [4]])
    write_dataset(tmp_path / "b", [[1, 2], [4]])
    os.replace(data_file_path(str(tmp_path / "b")), data_file_path(str(tmp_path / "a")))
    with pytest.raises(ValueError, match=r"describes 4 tokens .* found 6 bytes"):
        MMapIndexedDataset(str(tmp_path / "a"))


@pytest.mark.parametrize("offset, patch, pattern", [
    (0, b"XNTIDX\x00\x00\x00", r"expected magic b'MMIDIDX\\x00\\x00', found b'XNTIDX"),
    (0, b"TNTIDX\x00\x00\x00", r"is in GPT-NeoX's older 'cached' indexed format, which this "
                              r"project does not read; re-run tools/datasets/preprocess_data.py"),
    (9, struct.pack("<Q", 2), "expected index version 1, found 2"),
    (17, struct.pack("<B", 9), r"expected a dtype code in \[1, 2, 3, 4, 5, 6, 7, 8\], found 9"),
])
def test_corrupted_header_is_refused(small_dataset, offset, patch, pattern):
    prefix, _, _ = small_dataset
    with open(index_file_path(prefix), "r+b") as f:
        f.seek(offset)
        f.write(patch)
    with pytest.raises(ValueError, match=pattern) as err:
        MMapIndexedDataset(prefix)
    assert index_file_path(prefix) in str(err.value)


def test_truncated_index_is_refused(small_dataset):
    prefix, docs, _ = small_dataset
    size = os.path.getsize(index_file_path(prefix))
    with open(index_file_path(prefix), "r+b") as f:
        f.truncate(size - 8)
    with pytest.raises(ValueError, match=f"expected {size} bytes, found {size - 8}"):
        MMapIndexedDataset(prefix)


def test_dtype_choice_follows_the_vocabulary(tmp_path):
    assert best_fitting_dtype(50257) == np.uint16
    assert best_fitting_dtype(65536) == np.uint16
    assert best_fitting_dtype(65537) == np.int32
    assert best_fitting_dtype(None) == np.int32
    builder = make_builder(str(tmp_path / "big.bin"), vocab_size=100_000)
    assert builder.dtype == np.int32
    builder.add_item([99_999])
    builder.end_document()
    builder.finalize(str(tmp_path / "big.idx"))
    assert MMapIndexedDataset(str(tmp_path / "big"))[0].tolist() == [99_999]


@pytest.mark.parametrize("bad_id", [65536, -1])
def test_writer_rejects_ids_outside_the_dtype(tmp_path, bad_id):
    builder = make_builder(str(tmp_path / "x.bin"), vocab_size=50_000)
    with pytest.raises(ValueError) as err:
        builder.add_item([5, bad_id, 7])
    message = str(err.value)
    assert f"token id {bad_id}" in message and "uint16" in message
    assert str(tmp_path / "x.bin") in message
    builder.abort()
    assert os.listdir(tmp_path) == []


def test_bulk_documents_write_the_same_files_as_items(tmp_path, write_dataset,
                                                      random_documents):
    docs = random_documents(30, min_len=0, seed=4)
    write_dataset(tmp_path / "items", docs)
    builder = MMapIndexedDatasetBuilder(str(tmp_path / "bulk.bin"), dtype=np.uint16)
    builder.add_documents(np.concatenate(docs[:10]), [len(d) for d in docs[:10]])
    builder.add_documents(np.concatenate(docs[10:]).tolist(), [len(d) for d in docs[10:]])
    builder.add_documents([], [])
    builder.finalize(str(tmp_path / "bulk.idx"))
    for ext in (".bin", ".idx"):
        with open(tmp_path / f"items{ext}", "rb") as a, open(tmp_path / f"bulk{ext}", "rb") as b:
            assert a.read() == b.read()


@pytest.mark.parametrize("tokens, lengths, pattern", [
    ([1, 2, 3], [1, 1], "2 document lengths sum to 2 but 3 tokens were given"),
    ([1, 2], [3, -1], r"document lengths must be in 0..2\*\*31-1, got -1..3"),
    ([1, 70000], [2], r"token id 70000 in items 0..0 does not fit uint16"),
])
def test_bulk_documents_are_checked(tmp_path, tokens, lengths, pattern):
    builder = MMapIndexedDatasetBuilder(str(tmp_path / "x.bin"), dtype=np.uint16)
    with pytest.raises(ValueError, match=pattern):
        builder.add_documents(tokens, lengths)
    builder.abort()


def test_nothing_appears_before_finalize_and_errors_leave_nothing(tmp_path, write_dataset):
    prefix = str(tmp_path / "atomic")
    builder = MMapIndexedDatasetBuilder(data_file_path(prefix), dtype=np.uint16)
    builder.add_item([1, 2])
    builder.end_document()
    assert not os.path.exists(data_file_path(prefix))
    assert not os.path.exists(index_file_path(prefix))
    with pytest.raises(RuntimeError):
        with MMapIndexedDatasetBuilder(data_file_path(prefix), dtype=np.uint16) as other:
            other.add_item([3])
            raise RuntimeError("interrupted")
    builder.finalize(index_file_path(prefix))
    assert sorted(os.listdir(tmp_path)) == ["atomic.bin", "atomic.idx"]
    # Rewriting replaces the pair as a whole.
    write_dataset(prefix, [[9, 9, 9]])
    assert MMapIndexedDataset(prefix)[0].tolist() == [9, 9, 9]
    assert sorted(os.listdir(tmp_path)) == ["atomic.bin", "atomic.idx"]


def test_merge_appends_items_and_documents(tmp_path, write_dataset):
    write_dataset(tmp_path / "a", [[1, 2], [3]])
    write_dataset(tmp_path / "b", [[4, 5, 6], [], [7]])
    merged = str(tmp_path / "m")
    builder = MMapIndexedDatasetBuilder(data_file_path(merged), dtype=np.uint16)
    builder.merge_file_(str(tmp_path / "a"))
    builder.merge_file_(str(tmp_path / "b"))
    builder.finalize(index_file_path(merged))
    ds = MMapIndexedDataset(merged)
    assert [ds[i].tolist() for i in range(len(ds))] == [[1, 2], [3], [4, 5, 6], [], [7]]
    assert ds.doc_idx.tolist() == [0, 1, 2, 3, 4, 5]
    other = MMapIndexedDatasetBuilder(str(tmp_path / "i.bin"), dtype=np.int32)
    with pytest.raises(ValueError, match="dtypes differ"):
        other.merge_file_(str(tmp_path / "a"))
    other.abort()


def test_fingerprint_is_content_only_and_the_full_checksum_on_request(small_dataset):
    prefix, docs, ds = small_dataset
    fp = ds.fingerprint()
    with open(index_file_path(prefix), "rb") as f:
        assert fp["idx_sha256"] == hashlib.sha256(f.read()).hexdigest()
    with open(data_file_path(prefix), "rb") as f:
        bin_sha = hashlib.sha256(f.read()).hexdigest()
    assert fp["bin_bytes"] == os.path.getsize(data_file_path(prefix))
    assert fp["bin_sampled_sha256"] == bin_sha  # a file under 64 x 64 KiB is sampled whole
    assert fp["num_documents"] == len(docs) and fp["dtype"] == "uint16"
    assert fp["num_tokens"] == sum(len(d) for d in docs)
    assert "bin_sha256" not in fp
    assert not [k for k in fp if "time" in k]
    assert fp == ds.opened_fingerprint
    os.utime(data_file_path(prefix), (1, 1))  # touch: the same content
    assert ds.fingerprint() == fp
    assert ds.verify_checksum() == bin_sha
    with pytest.raises(ValueError, match="expected sha256 0000"):
        ds.verify_checksum("0000")


def test_reads_after_the_bin_shrank_name_the_file_and_both_sizes(small_dataset):
    """A memory-mapped read past the new end would die of SIGBUS; this one raises."""
    prefix, docs, ds = small_dataset
    ds.check_sizes()
    size = os.path.getsize(data_file_path(prefix))
    keep = int(ds.pointers[2])  # documents 0 and 1 stay readable
    with open(data_file_path(prefix), "r+b") as f:
        f.truncate(keep)
    assert ds[1].tolist() == docs[1].tolist()
    pattern = (f"{data_file_path(prefix)} shrank while training read it: expected {size} bytes "
               rf"\(as when it was opened\), found {keep} bytes")
    with pytest.raises(TokenFileChanged, match=pattern):
        ds[len(docs) - 1]
    with pytest.raises(TokenFileChanged, match=pattern):
        ds[0:len(docs)]
    with pytest.raises(TokenFileChanged, match=pattern):
        ds.check_sizes()


READ_AFTER_TRUNCATION = """
import os, sys
import numpy as np
from megatron.data.indexed_dataset import MMapIndexedDataset
prefix, how = sys.argv[1:]
dataset, mapped = MMapIndexedDataset(prefix), np.memmap(prefix + ".bin", np.uint16, mode="r")
os.truncate(prefix + ".bin", 0)
print(mapped[-1] if how == "memmap" else dataset[len(dataset) - 1])
"""


@pytest.mark.parametrize("how", ["memmap", "reader"])
def test_reading_a_bin_that_shrank_raises_where_a_mapped_read_dies_of_sigbus(small_dataset, how):
    prefix, _, _ = small_dataset
    proc = subprocess.run([sys.executable, "-c", READ_AFTER_TRUNCATION, prefix, how],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if how == "memmap":
        assert proc.returncode == -signal.SIGBUS, proc.stderr
    else:
        assert proc.returncode == 1, proc.stderr
        assert f"TokenFileChanged: {data_file_path(prefix)} shrank" in proc.stderr


def test_an_index_that_shrank_is_named_by_the_size_check(small_dataset):
    prefix, _, ds = small_dataset
    size = os.path.getsize(index_file_path(prefix))
    os.truncate(index_file_path(prefix), 0)  # reading ds.sizes now would be SIGBUS
    with pytest.raises(TokenFileChanged, match=f"{index_file_path(prefix)} shrank while training "
                                               f"read it: expected {size} bytes"):
        ds.check_sizes()


def test_max_token_id_and_vocab_check(small_dataset):
    prefix, docs, ds = small_dataset
    top = max(int(d.max()) for d in docs if len(d))
    assert ds.max_token_id() == top
    assert ds.max_token_id(chunk_tokens=7) == top
    ds.check_token_ids(top + 1)
    with pytest.raises(ValueError, match=f"holds token id {top}.*has {top} entries"):
        ds.check_token_ids(top)
