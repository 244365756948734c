"""Durable file primitives: hash-while-write digests, verification messages, retries (A22)."""

import errno
import hashlib

import pytest
import torch

from megatron.checkpointing import durable
from megatron.checkpointing.errors import CorruptFileError


def test_write_torch_records_the_size_and_sha256_of_the_bytes_on_disk(tmp_path):
    state = {"w": torch.arange(3_000_000, dtype=torch.float32), "step": 3}  # > 1 MiB buffers
    record = durable.write_torch(state, tmp_path / "s.pt")
    data = (tmp_path / "s.pt").read_bytes()
    assert record.size == len(data)
    assert record.sha256 == hashlib.sha256(data).hexdigest()
    assert torch.equal(torch.load(tmp_path / "s.pt")["w"], state["w"])


def test_write_bytes_and_sha256_file_agree(tmp_path):
    record = durable.write_bytes(b"hello", tmp_path / "f")
    assert record == durable.FileRecord(5, hashlib.sha256(b"hello").hexdigest())
    assert durable.sha256_file(tmp_path / "f") == (5, record.sha256)


def test_file_problem_names_the_file_and_what_is_wrong(tmp_path):
    path = tmp_path / "shard.pt"
    record = durable.write_bytes(b"0123456789", path)
    assert durable.file_problem(path, record) is None
    path.write_bytes(b"01234")
    assert durable.file_problem(path, record) == (
        f"{path}: 5 bytes but the manifest recorded 10 (truncated)")
    path.write_bytes(b"0123456788")
    problem = durable.file_problem(path, record)
    assert str(path) in problem and "sha256" in problem and "corrupt" in problem
    path.unlink()
    assert durable.file_problem(path, record) == (
        f"{path}: missing (the manifest lists it with 10 bytes)")


def test_load_torch_verified_returns_the_object_or_refuses_a_flipped_byte(tmp_path):
    path = tmp_path / "s.pt"
    record = durable.write_torch({"w": torch.ones(1000)}, path)
    assert torch.equal(durable.load_torch_verified(path, record)["w"], torch.ones(1000))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    torch.load(path)  # torch itself does not notice: it checks no checksum
    with pytest.raises(CorruptFileError, match=r"sha256 .* differs from the manifest's"):
        durable.load_torch_verified(path, record)


def _flaky(failures: int, code: int):
    calls = []

    def action():
        calls.append(1)
        if len(calls) <= failures:
            raise OSError(code, "simulated", "/ckpt/file")
        return "done"
    return action, calls


def test_transient_errors_are_retried_with_backoff():
    action, calls = _flaky(2, errno.EIO)
    slept = []
    assert durable.retry_io(action, "renaming x", sleep=slept.append) == "done"
    assert len(calls) == 3 and slept == list(durable.RETRY_DELAYS_S[:2])


def test_persistent_transient_errors_end_in_a_clear_error():
    action, calls = _flaky(100, errno.EAGAIN)
    with pytest.raises(OSError, match=r"renaming x still failed after 7 attempts") as err:
        durable.retry_io(action, "renaming x", sleep=lambda s: None)
    assert err.value.errno == errno.EAGAIN and len(calls) == 7


def test_enospc_is_not_retried():
    action, calls = _flaky(1, errno.ENOSPC)
    with pytest.raises(OSError) as err:
        durable.retry_io(action, "writing x", sleep=lambda s: None)
    assert err.value.errno == errno.ENOSPC and len(calls) == 1


def test_a_failed_fsync_rewrites_the_whole_file(tmp_path, monkeypatch):
    real_fsync, failed = durable.os.fsync, []

    def fsync_failing_once(fd):
        if not failed:
            failed.append(fd)
            raise OSError(errno.EIO, "simulated fsync failure")
        real_fsync(fd)

    monkeypatch.setattr(durable.os, "fsync", fsync_failing_once)
    monkeypatch.setattr(durable.time, "sleep", lambda s: None)
    record = durable.write_bytes(b"payload", tmp_path / "f")
    assert failed and (tmp_path / "f").read_bytes() == b"payload"
    assert record.sha256 == hashlib.sha256(b"payload").hexdigest()


def test_replace_text_leaves_no_temporary_file(tmp_path):
    durable.replace_text(tmp_path / "latest", "global_step2")
    durable.replace_text(tmp_path / "latest", "global_step4")
    assert (tmp_path / "latest").read_text() == "global_step4"
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]
