"""The manifest format: round trip, malformed files reported by field, the hashing split."""

import json

import pytest

from megatron.checkpointing.durable import write_bytes
from megatron.checkpointing.errors import CorruptFileError
from megatron.checkpointing.manifest import (FileEntry, Manifest, assign_files, check_files,
                                             read_manifest, write_manifest)


def manifest_of(files: dict[str, FileEntry]) -> Manifest:
    return Manifest(iteration=4, tag="global_step4", run={"tp": 1, "pp": 1, "dp": 2},
                    contents={"optimizer": True, "rng": True},
                    client_state={"iteration": 4, "consumed_train_samples": 64},
                    config={"hidden_size": 128}, files=files, versions={"torch": "x"})


def test_round_trip(tmp_path):
    m = manifest_of({"a.pt": FileEntry(3, "ab" * 32, 0),
                     "rng/rank_1.pt": FileEntry(9, "cd" * 32, 1)})
    write_manifest(tmp_path, m)
    assert read_manifest(tmp_path) == m
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["format_version"] == 1 and data["files"]["rng/rank_1.pt"]["rank"] == 1
    assert m.total_bytes == 12


@pytest.mark.parametrize("text, expected", [
    ("{not json", "not valid JSON"),
    ('{"format": "other"}', "not a gpt-neox-checkpoint manifest"),
    ('{"format": "gpt-neox-checkpoint", "format_version": 1}', "field 'iteration' is missing"),
])
def test_a_malformed_manifest_names_the_file_and_the_problem(tmp_path, text, expected):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(CorruptFileError, match=expected) as err:
        read_manifest(tmp_path)
    assert str(tmp_path / "manifest.json") in str(err.value)


def test_a_missing_manifest_says_the_save_did_not_complete(tmp_path):
    with pytest.raises(CorruptFileError, match="missing; the save that wrote .* did not complete"):
        read_manifest(tmp_path)


def test_files_are_split_by_size_and_every_rank_computes_the_same_split():
    files = {f"f{i}": FileEntry(size, "0" * 64, 0) for i, size in enumerate([100, 90, 10, 5, 1])}
    shares = assign_files(files, 2)
    assert shares == [["f0", "f3"], ["f1", "f2", "f4"]]  # 105 and 101 bytes
    assert sorted(sum(shares, [])) == sorted(files)
    assert assign_files(files, 2) == shares
    assert assign_files(files, 8)[7] == []


def test_check_files_checks_all_sizes_but_hashes_only_the_share(tmp_path):
    a, b = write_bytes(b"aaaa", tmp_path / "a"), write_bytes(b"bbbb", tmp_path / "b")
    m = manifest_of({"a": FileEntry(a.size, a.sha256, 0), "b": FileEntry(b.size, b.sha256, 0)})
    (tmp_path / "b").write_bytes(b"bbbx")  # same size, other content
    assert check_files(tmp_path, m, hash_names=["a"]) == []
    assert "sha256" in check_files(tmp_path, m, hash_names=["b"])[0]
    (tmp_path / "a").write_bytes(b"aa")
    assert check_files(tmp_path, m, hash_names=[]) == [
        f"{tmp_path / 'a'}: 2 bytes but the manifest recorded 4 (truncated)"]
