"""Data fingerprints: found through built datasets, compared on content only (sampled or full),
changes detected while a run reads the files, also from a loader worker."""

from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
import pytest

from megatron.data.content_hash import sample_ranges
from megatron.data.fingerprints import (CONTENT_KEYS, check_datasets_unchanged,
                                        check_file_sizes, compare_fingerprints,
                                        dataset_fingerprints, indexed_datasets)
from megatron.data.indexed_dataset import MMapIndexedDataset, TokenFileChanged
from megatron.data.loaders import build_data_loader, build_train_valid_test_datasets


@pytest.fixture
def prefixes(tmp_path, write_dataset, random_documents):
    a, b = str(tmp_path / "data" / "a"), str(tmp_path / "data" / "b")
    os.makedirs(tmp_path / "data")
    write_dataset(a, random_documents(50, max_len=30, min_len=5, seed=1))
    write_dataset(b, random_documents(30, max_len=60, min_len=20, seed=2))
    return a, b


def build(**kw):
    return build_train_valid_test_datasets(seq_length=8, seed=1, **kw)


def test_fingerprints_reach_every_file_through_blends_and_splits(prefixes):
    a, b = prefixes
    train, valid, test = build(train_data_paths=[a, b], valid_data_paths=[b],
                               train_valid_test_num_samples=(20, 5, 0))
    assert test is None and [d.path for d in indexed_datasets(valid)] == [b]
    fingerprints = dataset_fingerprints(train, valid, test)
    assert list(fingerprints) == [a, b]
    for prefix, fingerprint in fingerprints.items():
        assert fingerprint == MMapIndexedDataset(prefix).fingerprint()
    single, _, _ = build(data_path=a, split="1", train_valid_test_num_samples=(5, 0, 0))
    assert list(dataset_fingerprints(single)) == [a]
    with pytest.raises(TypeError, match="cannot find the token files of a list"):
        dataset_fingerprints([1, 2])


def test_same_data_compares_equal_after_a_json_round_trip(prefixes):
    a, b = prefixes
    train, _, _ = build(train_data_paths=[a, b], train_valid_test_num_samples=(20, 0, 0))
    saved = json.loads(json.dumps(dataset_fingerprints(train)))
    assert compare_fingerprints(saved, dataset_fingerprints(train)) == []
    assert compare_fingerprints(list(saved.values()), dataset_fingerprints(train)) == []
    assert sorted(saved[a]) == sorted({"prefix", "bin_sample", *CONTENT_KEYS} - {"bin_sha256"})
    full = dataset_fingerprints(train, mode="full")
    assert full[a]["bin_sha256"] == MMapIndexedDataset(a).verify_checksum()
    # a checkpoint of a sampled run resumed in full mode and back compares what both hold
    assert compare_fingerprints(saved, full) == compare_fingerprints(full, saved) == []
    with pytest.raises(ValueError, match="data_fingerprint 'some' is not a valid choice; choose "
                                         "one of: sampled, full"):
        dataset_fingerprints(train, mode="some")


def test_data_copied_elsewhere_with_new_mtimes_still_matches(prefixes, tmp_path):
    a, b = prefixes
    train, _, _ = build(train_data_paths=[a, b], train_valid_test_num_samples=(20, 0, 0))
    saved = dataset_fingerprints(train)
    moved = tmp_path / "elsewhere"
    os.makedirs(moved)
    for prefix in (a, b):
        for ext in (".bin", ".idx"):
            shutil.copy(prefix + ext, moved / (os.path.basename(prefix) + ext))
            os.utime(moved / (os.path.basename(prefix) + ext), (1, 1))
    copied, _, _ = build(train_data_paths=[str(moved / "a"), str(moved / "b")],
                         train_valid_test_num_samples=(20, 0, 0))
    assert compare_fingerprints(saved, dataset_fingerprints(copied)) == []


def test_changed_added_and_dropped_files_are_named(prefixes, tmp_path, write_dataset,
                                                  random_documents):
    a, b = prefixes
    train, _, _ = build(train_data_paths=[a, b], train_valid_test_num_samples=(20, 0, 0))
    saved = dataset_fingerprints(train)
    old_tokens = saved[b]["num_tokens"]
    write_dataset(b, random_documents(31, max_len=60, min_len=20, seed=2))  # one more document
    c = str(tmp_path / "data" / "c")
    write_dataset(c, random_documents(10, min_len=5, seed=3))
    now, _, _ = build(train_data_paths=[b, c], train_valid_test_num_samples=(20, 0, 0))
    problems = compare_fingerprints(saved, dataset_fingerprints(now))
    new_tokens = MMapIndexedDataset(b).num_tokens
    assert f"{b}: num_documents was 30 in the checkpoint, is 31 now" in problems
    assert f"{b}: num_tokens was {old_tokens} in the checkpoint, is {new_tokens} now" in problems
    assert any(p.startswith(f"{b}: idx_sha256 was ") for p in problems)
    assert f"{a}: read by the checkpointed run, not by this one" in problems
    assert f"{c}: read by this run, not by the checkpointed one" in problems


def test_moved_and_changed_file_is_paired_by_name(prefixes, tmp_path):
    a, _ = prefixes
    saved = dataset_fingerprints(MMapIndexedDataset(a))
    current = {str(tmp_path / "new" / "a"): dict(saved[a], prefix="x", dtype="int32")}
    assert compare_fingerprints(saved, current) == [
        f"{a} (now {tmp_path / 'new' / 'a'}): dtype was uint16 in the checkpoint, is int32 now"]


def test_files_changed_while_open_are_detected_but_touch_is_not(prefixes):
    a, b = prefixes
    train, valid, _ = build(train_data_paths=[a, b], valid_data_paths=[a],
                            train_valid_test_num_samples=(20, 5, 0))
    check_datasets_unchanged(train, valid, None)
    for path in (a + ".bin", a + ".idx", b + ".bin"):
        os.utime(path)  # touch: new mtime, same content
    check_datasets_unchanged(train, valid)
    with open(b + ".bin", "r+b") as f:  # same size and index, new bytes
        f.write(b"\xff\xff")
    with pytest.raises(TokenFileChanged, match=f"changed on disk while training read them: {b}: "
                                              "bin_sampled_sha256 was [0-9a-f]{12}... when this "
                                              "run opened it, is [0-9a-f]{12}... now"):
        check_datasets_unchanged(train, valid)
    os.remove(a + ".idx")
    with pytest.raises(TokenFileChanged, match=f"{a}.idx was removed"):
        check_datasets_unchanged(train, valid)


@pytest.fixture
def big_prefix(tmp_path, write_dataset):
    """A 6 MB .bin: bigger than the 64 sampled blocks of 64 KiB, so gaps lie between them."""
    prefix = str(tmp_path / "big")
    rng = np.random.default_rng(0)
    write_dataset(prefix, [rng.integers(0, 50000, 3000) for _ in range(1000)])
    return prefix


def flip(path: str, offset: int, count: int = 8) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(count)
        f.seek(offset)
        f.write(bytes(255 - x for x in data))


def test_same_size_change_in_a_sampled_block_is_caught_in_either_mode(big_prefix):
    saved = dataset_fingerprints(MMapIndexedDataset(big_prefix), mode="full")
    offset, length = sample_ranges(saved[big_prefix]["bin_bytes"])[10]
    flip(big_prefix + ".bin", offset + length // 2)
    problems = compare_fingerprints(saved, dataset_fingerprints(MMapIndexedDataset(big_prefix)))
    assert [p.split(" was ")[0] for p in problems] == [f"{big_prefix}: bin_sampled_sha256"]
    full = dataset_fingerprints(MMapIndexedDataset(big_prefix), mode="full")
    assert [p.split(" was ")[0] for p in compare_fingerprints(saved, full)] == [
        f"{big_prefix}: bin_sampled_sha256", f"{big_prefix}: bin_sha256"]


def test_same_size_change_between_sampled_blocks_is_caught_only_in_full_mode(big_prefix):
    saved = dataset_fingerprints(MMapIndexedDataset(big_prefix), mode="full")
    (first, length), (second, _) = sample_ranges(saved[big_prefix]["bin_bytes"])[:2]
    assert second - (first + length) > 8
    flip(big_prefix + ".bin", first + length + 2)
    sampled = dataset_fingerprints(MMapIndexedDataset(big_prefix))
    assert compare_fingerprints(saved, sampled) == []  # what sampled hashing cannot see
    full = dataset_fingerprints(MMapIndexedDataset(big_prefix), mode="full")
    assert [p.split(" was ")[0] for p in compare_fingerprints(saved, full)] == [
        f"{big_prefix}: bin_sha256"]


def test_a_loader_worker_reading_an_index_that_shrank_names_it(prefixes):
    """The worker checks the mapped .idx's size before reading it (reading past its new end
    would kill the worker with SIGBUS, which torch reports as a shared-memory problem)."""
    a, _ = prefixes
    train, _, _ = build(data_path=a, split="1", train_valid_test_num_samples=(40, 0, 0))
    idx_bytes = os.path.getsize(a + ".idx")
    loader = build_data_loader(train, 0, micro_batch_size=2, data_parallel_rank=0,
                               data_parallel_size=1, num_workers=1)
    batches = iter(loader)
    try:
        next(batches)
        check_file_sizes(train)
        # the worker reads ahead: truncating under a read in flight, after its size check,
        # kills it with SIGBUS (the loop then names the file from the main process)
        wait_until_read_ahead(batches)
        os.truncate(a + ".idx", 0)
        expected = (f"{a}.idx shrank while training read it: expected {idx_bytes} bytes .* "
                    "found 0 bytes")
        with pytest.raises(TokenFileChanged,
                           match=f"in DataLoader worker process 0(.|\n)*{expected}"):
            for _ in batches:
                pass
        with pytest.raises(TokenFileChanged, match=f"^{expected}"):
            check_file_sizes(train)
    finally:  # a worker left running would fail pytest itself when it dies
        batches._shutdown_workers()


def wait_until_read_ahead(batches, timeout: float = 60.0) -> None:
    """Until the loader's workers have delivered every batch asked of them, so that they wait
    for the next index and read nothing."""
    deadline = time.monotonic() + timeout
    while batches._data_queue.qsize() < batches._tasks_outstanding:
        assert time.monotonic() < deadline, "the loader's worker delivered nothing in time"
        time.sleep(0.01)
