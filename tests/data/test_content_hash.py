"""Sampled and full content hashes of token files: which bytes they see and which they cannot."""

from __future__ import annotations

import hashlib
import os

import pytest

from megatron.data.content_hash import (SAMPLE_BLOCK_BYTES, SAMPLE_BLOCKS, full_sha256,
                                        sample_ranges, sampled_sha256)


def test_sample_ranges_cover_the_start_the_end_and_evenly_between():
    assert sample_ranges(0) == [(0, 0)]
    whole = SAMPLE_BLOCKS * SAMPLE_BLOCK_BYTES
    assert sample_ranges(whole) == [(0, whole)]
    assert len(sample_ranges(whole + 1)) == SAMPLE_BLOCKS
    size = 10**12  # a terabyte file: 4 MiB are read
    ranges = sample_ranges(size)
    assert len(ranges) == SAMPLE_BLOCKS and {n for _, n in ranges} == {SAMPLE_BLOCK_BYTES}
    assert ranges[0][0] == 0 and ranges[-1][0] + SAMPLE_BLOCK_BYTES == size
    gaps = {b[0] - a[0] for a, b in zip(ranges, ranges[1:])}
    assert max(gaps) - min(gaps) <= 1
    assert sample_ranges(100, blocks=4, block_bytes=10) == [(0, 10), (30, 10), (60, 10), (90, 10)]
    with pytest.raises(ValueError, match="at least 2 blocks"):
        sample_ranges(100, blocks=1)


@pytest.fixture
def token_file(tmp_path):
    path = str(tmp_path / "tokens.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(1000))
    return path


def overwrite(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_a_change_inside_a_sampled_block_is_seen(token_file):
    kw = dict(blocks=4, block_bytes=50)  # blocks at 0, 317, 633, 950
    sampled, full = sampled_sha256(token_file, **kw), full_sha256(token_file)
    with open(token_file, "rb") as f:
        data = f.read()
    assert sampled == hashlib.sha256(
        b"".join(data[o: o + n] for o, n in sample_ranges(1000, **kw))).hexdigest()
    assert full == hashlib.sha256(data).hexdigest()
    overwrite(token_file, 640, bytes(255 - b for b in data[640:644]))
    assert os.path.getsize(token_file) == 1000
    assert sampled_sha256(token_file, **kw) != sampled and full_sha256(token_file) != full


def test_a_change_between_sampled_blocks_is_seen_only_by_the_full_hash(token_file):
    kw = dict(blocks=4, block_bytes=50)
    sampled, full = sampled_sha256(token_file, **kw), full_sha256(token_file)
    with open(token_file, "rb") as f:
        data = f.read()
    overwrite(token_file, 100, bytes(255 - b for b in data[100:200]))  # inside the gap 50..316
    assert sampled_sha256(token_file, **kw) == sampled  # what sampled hashing cannot see
    assert full_sha256(token_file) != full


def test_a_file_smaller_than_the_blocks_is_hashed_whole(token_file):
    assert sampled_sha256(token_file) == full_sha256(token_file)
