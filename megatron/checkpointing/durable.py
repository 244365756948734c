"""Durable files: hashed while written, fsynced, renamed atomically, retried when storage hiccups.

A file is written in one pass: each buffer goes to the OS while a helper thread feeds the same
buffer to sha256 (hashlib releases the GIL); every 256 MiB a background fdatasync starts the
write-back, and the closing fsync makes the rest durable; the caller gets size and digest (A22).
torch.save's own per-record CRC32 is switched off for our files: torch.load never checks it, and
the sha256 covers every byte. Loading verifies first (nothing corrupt is unpickled), then maps
the file (torch.load(mmap=True)) so that its bytes are not copied a second time.

Transient errors (EAGAIN, EINTR, EBUSY, EIO, ETIMEDOUT, ESTALE) are retried with exponential
backoff, then reported naming the path and the number of attempts. A file write is retried from
the start: after a failed fsync the kernel may have dropped the written pages, so only a rewrite
is a safe retry. ENOSPC, EDQUOT and other errors are not retried (A21).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from megatron.checkpointing.errors import CorruptFileError
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)

T = TypeVar("T")
TRANSIENT_ERRNOS = frozenset({errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.EIO,
                              errno.ETIMEDOUT, errno.ESTALE})
RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
_CHUNK = 8 << 20  # read size when hashing a file
_HASH_ASIDE = 1 << 20  # buffers at least this big are hashed on the helper thread
_SYNC_EVERY = 256 << 20  # bytes between background fdatasyncs of a file being written


@dataclass(frozen=True)
class FileRecord:
    """A file's size in bytes and the hex sha256 of its content."""

    size: int
    sha256: str


def retry_io(action: Callable[[], T], what: str, delays: tuple[float, ...] | None = None,
             sleep: Callable[[float], None] | None = None) -> T:
    """Run `action`; on a transient OSError wait and run it again, once per delay
    (RETRY_DELAYS_S unless given)."""
    delays = RETRY_DELAYS_S if delays is None else delays
    sleep = sleep or time.sleep
    for attempt, delay in enumerate((*delays, None), start=1):
        try:
            return action()
        except OSError as err:
            if err.errno not in TRANSIENT_ERRNOS:
                raise
            if delay is None:
                raise OSError(err.errno, f"{what} still failed after {attempt} attempts "
                                         f"({sum(delays):.1f}s of backoff): {err.strerror or err}",
                              err.filename) from err
            log.warning("%s failed (%s), attempt %d; retrying in %.2fs", what, err, attempt, delay)
            sleep(delay)
    raise AssertionError("unreachable")


class _HashingWriter:
    """Write-only stream for torch.save: passes bytes to the file `f` and hashes them on a helper
    thread; every _SYNC_EVERY bytes it starts an fdatasync on another, so the disk writes back
    while serialisation goes on and the closing fsync has little left to wait for."""

    def __init__(self, f, pool: ThreadPoolExecutor):
        self._f = f
        self._pool = pool  # two threads: the hash, the background sync
        self._sha = hashlib.sha256()
        self._sync = None
        self._unsynced = 0
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes >= _HASH_ASIDE:
            # the buffer is only valid during this call: hash it while it is being written
            hashed = self._pool.submit(self._sha.update, view)
            try:
                self._f.write(view)
            finally:
                hashed.result()
        else:
            self._sha.update(view)
            self._f.write(view)
        self.size += view.nbytes
        self._unsynced += view.nbytes
        if self._unsynced >= _SYNC_EVERY and (self._sync is None or self._sync.done()):
            self._sync_done()
            self._f.flush()
            self._sync = self._pool.submit(os.fdatasync, self._f.fileno())
            self._unsynced = 0
        return view.nbytes

    def _sync_done(self) -> None:
        if self._sync is not None:
            self._sync.result()  # raises the background sync's error, if any

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        """Flush and fsync everything written (the file stays open)."""
        self._sync_done()
        self._f.flush()
        os.fsync(self._f.fileno())

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def _write_once(path: Path, produce: Callable[[_HashingWriter], None]) -> FileRecord:
    with open(path, "wb") as f, ThreadPoolExecutor(2, thread_name_prefix="ckpt-io") as pool:
        out = _HashingWriter(f, pool)
        produce(out)
        out.close()
        on_disk = os.fstat(f.fileno()).st_size
    if on_disk != out.size:  # the producer seeked: what we hashed is not the file
        return FileRecord(*sha256_file(path))
    return FileRecord(out.size, out.hexdigest())


def write_with(path: str | os.PathLike, produce: Callable[[_HashingWriter], None]) -> FileRecord:
    """Create `path` from what `produce(stream)` writes; fsynced, hashed, retried if transient."""
    path = Path(path)
    return retry_io(lambda: _write_once(path, produce), f"writing {path}")


@contextlib.contextmanager
def _without_zip_crc32():
    """Skip the CRC32 torch.save computes per zip record: torch.load never checks it (a
    flipped byte loads silently), and the sha256 we record covers every byte."""
    import torch.serialization as serialization

    if not hasattr(serialization, "set_crc32_options"):
        yield
        return
    previous = serialization.get_crc32_options()
    serialization.set_crc32_options(False)
    try:
        yield
    finally:
        serialization.set_crc32_options(previous)


def write_torch(obj, path: str | os.PathLike) -> FileRecord:
    """torch.save `obj` to `path` durably; returns its size and sha256."""
    import torch

    def save(out) -> None:
        with _without_zip_crc32():
            torch.save(obj, out)

    return write_with(path, save)


def write_bytes(data: bytes, path: str | os.PathLike) -> FileRecord:
    """Write `data` to `path` durably; returns its size and sha256."""
    return write_with(path, lambda out: out.write(data))


def sha256_file(path: str | os.PathLike) -> tuple[int, str]:
    """(size, hex sha256) of the file's content."""
    sha, size = hashlib.sha256(), 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            sha.update(view[:n])
            size += n
    return size, sha.hexdigest()


def file_problem(path: Path, record: FileRecord, check_hash: bool = True) -> str | None:
    """What is wrong with `path` compared with `record` (missing, size, content), or None."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path}: missing (the manifest lists it with {record.size} bytes)"
    except OSError as err:
        return f"{path}: cannot be read ({err})"
    if size != record.size:
        kind = "truncated" if size < record.size else "longer than written"
        return f"{path}: {size} bytes but the manifest recorded {record.size} ({kind})"
    if not check_hash:
        return None
    try:
        _, digest = retry_io(lambda: sha256_file(path), f"reading {path}")
    except OSError as err:
        return f"{path}: cannot be read ({err})"
    if digest != record.sha256:
        return (f"{path}: sha256 {digest[:16]}... differs from the manifest's "
                f"{record.sha256[:16]}... (the content changed after it was written: corrupt)")
    return None


def load_torch(path: str | os.PathLike, map_location=None):
    """torch.load with the file memory-mapped: tensors are read from the page cache when used
    (a verified file was just read through it), not copied a second time. Files torch cannot
    map (the legacy format) are read normally. Our files are never changed in place (a save
    writes new files and renames), so mapped tensors stay valid; writes to them copy on write.
    A tensor kept after loading (optimizer state) keeps its file allocated on disk even if the
    file is deleted, so retention keeps the checkpoint a process loaded (engine_state.in_use)."""
    import torch

    try:
        return torch.load(path, map_location=map_location, mmap=True, weights_only=False)
    except RuntimeError as err:
        if "mmap" not in str(err):
            raise
        return torch.load(path, map_location=map_location, weights_only=False)


def load_torch_verified(path: str | os.PathLike, record: FileRecord, map_location=None):
    """`load_torch(path)` after checking the file's size and sha256 against `record`;
    CorruptFileError otherwise. Nothing is unpickled before the content is known to be
    what was written."""
    path = Path(path)
    problem = file_problem(path, record)
    if problem:
        raise CorruptFileError(problem)
    return load_torch(path, map_location)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make the directory's entries (created, renamed, removed files) durable."""
    def sync() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    retry_io(sync, f"fsync of directory {path}")


def rename(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Atomically rename `src` to `dst` (replacing a file or an empty directory)."""
    retry_io(lambda: os.replace(src, dst), f"renaming {src} to {dst}")


def replace_text(path: str | os.PathLike, text: str) -> None:
    """Replace `path`'s content with `text` atomically: temporary file, fsync, rename, fsync dir."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    write_bytes(text.encode("utf-8"), tmp)
    rename(tmp, path)
    fsync_dir(path.parent)


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes available to this user on the filesystem holding `path`."""
    return shutil.disk_usage(path).free


def discard_dir(path: Path, trash: Path) -> None:
    """Remove a directory tree: renamed to `trash` first, so a crash midway never leaves a
    half-deleted directory under its real name."""
    if trash.exists():
        shutil.rmtree(trash, ignore_errors=True)
    rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)
