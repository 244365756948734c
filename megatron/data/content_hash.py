"""sha256 of a token file's content: of sampled blocks at fixed offsets, or of every byte.

Hashing a terabyte `.bin` in full takes many minutes on every rank, so the default fingerprint
(A16, A17) hashes `SAMPLE_BLOCKS` blocks of `SAMPLE_BLOCK_BYTES` bytes: the first block, the
last block and the rest evenly spaced between them, at offsets that depend on the file size
only (the same file gives the same hash on every machine). A file no bigger than all the blocks
together is hashed whole. The sampled hash sees every change in those blocks and nothing in the
bytes between them: on a file of S bytes, S - 64 * 64 KiB bytes are never read (a 1 TB file:
all but 4 MiB). `full_sha256` reads every byte.
"""

from __future__ import annotations

import hashlib
import os

SAMPLE_BLOCKS = 64
SAMPLE_BLOCK_BYTES = 1 << 16
READ_BYTES = 1 << 22


def sample_ranges(size: int, blocks: int = SAMPLE_BLOCKS,
                  block_bytes: int = SAMPLE_BLOCK_BYTES) -> list[tuple[int, int]]:
    """[(offset, length)] that the sampled hash of a `size`-byte file reads, in file order.

    One range covering the file when it fits in `blocks` blocks; otherwise `blocks` blocks of
    `block_bytes`, the first at 0, the last ending at `size`, the others evenly spaced.
    """
    if blocks < 2 or block_bytes < 1:
        raise ValueError(f"sampled hashing needs at least 2 blocks of at least 1 byte, got "
                         f"{blocks} blocks of {block_bytes} bytes")
    if size <= blocks * block_bytes:
        return [(0, size)]
    step = (size - block_bytes) / (blocks - 1)
    return [(round(i * step), block_bytes) for i in range(blocks)]


def sample_description(blocks: int = SAMPLE_BLOCKS, block_bytes: int = SAMPLE_BLOCK_BYTES) -> str:
    """How the sampled hash was taken; two sampled hashes compare only when this is equal."""
    return f"{blocks} blocks of {block_bytes} bytes"


def sampled_sha256(path: str, blocks: int = SAMPLE_BLOCKS,
                   block_bytes: int = SAMPLE_BLOCK_BYTES) -> str:
    """sha256 of the bytes in `sample_ranges` of the file at `path` (its current size)."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        for offset, length in sample_ranges(size, blocks, block_bytes):
            for start in range(offset, offset + length, READ_BYTES):
                want = min(READ_BYTES, offset + length - start)
                chunk = os.pread(f.fileno(), want, start)
                if len(chunk) != want:
                    raise RuntimeError(f"{path} shrank while it was being hashed: expected "
                                       f"{size} bytes, could read only {start + len(chunk)}")
                h.update(chunk)
    return h.hexdigest()


def full_sha256(path: str) -> str:
    """sha256 of every byte of the file at `path`."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ_BYTES):
            h.update(chunk)
    return h.hexdigest()
