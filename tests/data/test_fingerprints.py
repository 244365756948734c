"""Data fingerprints: found through built datasets, compared on content only, changes detected."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from megatron.data.fingerprints import (CONTENT_KEYS, check_datasets_unchanged,
                                        compare_fingerprints, dataset_fingerprints,
                                        indexed_datasets)
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.loaders import build_train_valid_test_datasets


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
    content = dataset_fingerprints(train, content_only=True)
    assert sorted(content[a]) == sorted(("prefix",) + CONTENT_KEYS)
    assert compare_fingerprints(content, dataset_fingerprints(train)) == []


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
    current = dataset_fingerprints(copied)
    assert current[str(moved / "a")]["idx_mtime"] != saved[a]["idx_mtime"]
    assert compare_fingerprints(saved, current) == []


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


def test_files_changed_while_open_are_detected(prefixes):
    a, b = prefixes
    train, valid, _ = build(train_data_paths=[a, b], valid_data_paths=[a],
                            train_valid_test_num_samples=(20, 5, 0))
    check_datasets_unchanged(train, valid, None)
    with open(b + ".bin", "r+b") as f:  # same size and index; new bytes and mtime
        f.write(b"\xff\xff")
    os.utime(b + ".bin", (1, 1))
    with pytest.raises(RuntimeError, match=f"indexed dataset {b} changed on disk"):
        check_datasets_unchanged(train, valid)
