"""The `.bin`/`.idx` token file pair (GPT-NeoX / Megatron "mmap" format): reader, writer, checks.

A dataset is a prefix `P` naming two files, `P.bin` (the tokens) and `P.idx` (where they are).

Byte layout of `P.idx` (all integers little-endian, no padding anywhere):

    offset        size       field
    0             9          magic, the bytes b"MMIDIDX\\x00\\x00"
    9             8          version, uint64, always 1
    17            1          dtype code, uint8 (table below)
    18            8          N, uint64: number of items (sequences)
    26            8          D, uint64: number of entries in the document index
    34            4 * N      sizes, int32[N]: tokens in each item
    34 + 4N       8 * N      pointers, int64[N]: byte offset of each item in P.bin
    34 + 12N      8 * D      doc_idx, int64[D]: item index where each document starts;
                             doc_idx[0] == 0 and doc_idx[-1] == N, so there are D - 1 documents
    total = 34 + 12N + 8D bytes

dtype codes (GPT-NeoX's table): 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float32, 7 float64,
8 uint16. Not every writer agrees on the float codes: Megatron-LM's core reads 6 as float64 and
7 as float32, older Megatron and GPT-NeoX versions read 6 as numpy's old `np.float` (float64),
and this project's writer once wrote float64 as 6. So a float code alone does not give the
width: the reader takes it from the data, from the pointers (byte offsets) where an item before
the last holds values, else from the `.bin`'s size per value, and uses the table only where no
value exists (`float_dtype`). Token files use the unsigned or non-negative integer codes. Two
other kinds of file share the format, written with `values=`:
- label files (post-training; GPT-NeoX's convention): int32, one label per token of the token
  file beside them, the token's id where it carries loss and -100 (IGNORE_LABEL) where it does
  not;
- reward files (KTO): float64 (code 7), one value per document.

`P.bin` is the items' tokens back to back in the index's dtype, in native little-endian order:
item i occupies bytes [pointers[i], pointers[i] + sizes[i] * itemsize). Its size is exactly
sum(sizes) * itemsize; the reader refuses a pair where it is not (truncated or extra bytes).

GPT-NeoX's preprocessing writes one item per document, so items and documents coincide there.
"""

from __future__ import annotations

import mmap
import os
import shutil
import struct
import uuid
from typing import Any, Sequence

import numpy as np

from megatron.data import content_hash
from megatron.monitoring.logger import get_logger

logger = get_logger(__name__)

MAGIC = b"MMIDIDX\x00\x00"
CACHED_MAGIC = b"TNTIDX\x00\x00"  # GPT-NeoX's older 'cached' / 'lazy' index format
VERSION = 1
HEADER_BYTES = 34  # magic 9 + version 8 + dtype code 1 + N 8 + D 8
WRITE_BUFFER_BYTES = 1 << 22

DTYPES: dict[int, type] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float32,
    7: np.float64,
    8: np.uint16,
}
FLOAT_CODES = (6, 7)  # their width is read from the data where it can be (float_dtype)
_WRITABLE_CODES: dict[type, int] = {np.dtype(t).type: code for code, t in DTYPES.items()}
IGNORE_LABEL = -100  # a label file's value at a position that carries no loss
VALUE_KINDS = {"tokens": None, "labels": np.int32, "rewards": np.float64}


def data_file_path(prefix: str) -> str:
    """`prefix.bin`: the token file."""
    return str(prefix) + ".bin"


def index_file_path(prefix: str) -> str:
    """`prefix.idx`: the index file."""
    return str(prefix) + ".idx"


def best_fitting_dtype(vocab_size: int | None = None) -> type:
    """uint16 when every id below `vocab_size` fits it (vocab_size <= 65536), else int32 (A12)."""
    if vocab_size is not None and vocab_size <= np.iinfo(np.uint16).max + 1:
        return np.uint16
    return np.int32


def dtype_code(dtype: Any) -> int:
    """The index file's code for a numpy dtype of the table; ValueError for anything else."""
    key = np.dtype(dtype).type
    if key not in _WRITABLE_CODES:
        raise ValueError(
            f"token dtype {np.dtype(dtype).name} cannot be written; use one of "
            f"{sorted(np.dtype(t).name for t in _WRITABLE_CODES)}"
        )
    return _WRITABLE_CODES[key]


# ----------------------------------------------------------------------------------------------
# Reader
# ----------------------------------------------------------------------------------------------


def _read_header(f, idx_path: str) -> tuple[int, int, int]:
    """Parse and check the fixed header of the open `.idx` file `f`; returns (dtype code, N, D)."""
    head = os.pread(f.fileno(), HEADER_BYTES, 0)
    if head[:8] == CACHED_MAGIC:
        raise ValueError(
            f"{idx_path} is in GPT-NeoX's older 'cached' indexed format, which this project does "
            "not read; re-run tools/datasets/preprocess_data.py on the source documents to write "
            "the mmap format")
    if head[:9] != MAGIC:
        raise ValueError(
            f"{idx_path} is not an mmap index file: expected magic {MAGIC!r}, found {head[:9]!r}"
            " (was it written by another tool or overwritten?)"
        )
    if len(head) < HEADER_BYTES:
        raise ValueError(f"{idx_path} is truncated: expected a {HEADER_BYTES}-byte header, "
                         f"found {len(head)} bytes")
    version, code, n, d = struct.unpack("<QBQQ", head[9:])
    if version != VERSION:
        raise ValueError(f"{idx_path}: expected index version {VERSION}, found {version}")
    if code not in DTYPES:
        raise ValueError(f"{idx_path}: expected a dtype code in {sorted(DTYPES)}, found {code}")
    return code, n, d


def float_dtype(code: int, sizes: np.ndarray, pointers: np.ndarray, bin_bytes: int,
                idx_path: str) -> type:
    """float32 or float64 for the float code 6 or 7, from the data's width where it has values
    (part of the header check, A16).

    The pointers are byte offsets, so where an item before the last holds values the last
    pointer over their count is the width; a width other than 4 or 8 is an error naming the
    file. Otherwise the `.bin`'s size over the value count decides when it is 4 or 8 bytes a
    value; a file with no value (or a `.bin` of another size, refused later) takes GPT-NeoX's
    table.
    """
    before_last = int(sizes[:-1].sum(dtype=np.int64))
    total = before_last + (int(sizes[-1]) if len(sizes) else 0)
    if before_last:
        width, rest = divmod(int(pointers[-1]), before_last)
        if rest or width not in (4, 8):
            raise ValueError(
                f"{idx_path}: dtype code {code} means float32 or float64 (depending on the "
                f"writer), but its pointers put {before_last} values in {int(pointers[-1])} "
                "bytes, neither 4 nor 8 bytes a value; the index is corrupt")
    elif total and bin_bytes in (4 * total, 8 * total):
        width = bin_bytes // total
    else:
        return DTYPES[code]
    return np.float32 if width == 4 else np.float64


def _missing_pair(path: str, idx_path: str, bin_path: str, missing: list[str]) -> str:
    """What to do about a prefix whose .idx / .bin is missing: the prefix meant (a path given
    with its extension), where a relative path was looked for, how to make the pair."""
    text = (f"indexed dataset {path!r} needs both {idx_path} and {bin_path}; missing: "
            f"{', '.join(missing)}.")
    stem, ext = os.path.splitext(path)
    if ext in (".bin", ".idx") and all(os.path.isfile(stem + e) for e in (".bin", ".idx")):
        return f"{text} Did you mean {stem!r}? Give the prefix, without .bin or .idx."
    if not os.path.isabs(path):
        text += f" (relative paths start at the working directory, {os.getcwd()})"
    if os.path.basename(path) == "builtin_text_document":
        return (f"{text} Make the built-in dataset with python tools/datasets/prepare_data.py "
                f"builtin -d {os.path.dirname(os.path.dirname(path)) or '.'}")
    return (f"{text} Pass the prefix without the extension, and create the pair with "
            "tools/datasets/preprocess_data.py.")


class TokenFileChanged(RuntimeError):
    """A token file's size no longer matches its index while the dataset reads it (A16)."""


class MMapIndexedDataset:
    """Read-only view of a `.bin`/`.idx` pair; `ds[i]` is item i as a numpy array.

    The `.idx` is memory-mapped. Tokens are read from the `.bin` with `pread`: a memory-mapped
    read past the end of a file that shrank kills the process with SIGBUS, which Python cannot
    catch, while a short `pread` raises `TokenFileChanged` naming the file and both sizes.

    Opening checks the pair (A16): both files exist, the header's magic, version and dtype code,
    the index file's length, pointers and document index, and that the `.bin` holds exactly the
    bytes the index describes. The content fingerprint taken at open (sizes, `.idx` hash, sampled
    `.bin` hash, counts; see `fingerprint`) is kept in `opened_fingerprint`.
    """

    def __init__(self, path: str, skip_warmup: bool = True):
        self._path = str(path)
        self._skip_warmup = skip_warmup
        self._open()
        self.opened_fingerprint = self.fingerprint()

    # -- opening and checks --------------------------------------------------------------------
    def _open(self) -> None:
        idx_path, bin_path = index_file_path(self._path), data_file_path(self._path)
        missing = [p for p in (idx_path, bin_path) if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(_missing_pair(self._path, idx_path, bin_path, missing))
        self._idx_file = open(idx_path, "rb", buffering=0)
        self._bin_file = open(bin_path, "rb", buffering=0)
        code, n, d = _read_header(self._idx_file, idx_path)
        self._idx_bytes = HEADER_BYTES + 12 * n + 8 * d
        found = os.fstat(self._idx_file.fileno()).st_size
        if found != self._idx_bytes:
            raise ValueError(f"{idx_path}: header describes {n} items and {d} document entries, "
                             f"so expected {self._idx_bytes} bytes, found {found}")
        index = np.empty(0, dtype=np.uint8)
        if self._idx_bytes > HEADER_BYTES:
            mapped = mmap.mmap(self._idx_file.fileno(), 0, access=mmap.ACCESS_READ)
            index = np.frombuffer(mapped, dtype=np.uint8, offset=HEADER_BYTES)
        self._sizes = index[: 4 * n].view(np.int32)
        self._pointers = index[4 * n: 12 * n].view(np.int64)
        self._doc_idx = index[12 * n:].view(np.int64)
        for a in (self._sizes, self._pointers, self._doc_idx):
            a.flags.writeable = False
        self._dtype = DTYPES[code]
        if code in FLOAT_CODES:
            bin_bytes = os.fstat(self._bin_file.fileno()).st_size
            self._dtype = float_dtype(code, self._sizes, self._pointers, bin_bytes, idx_path)
        self._check_index(idx_path)
        self._bin_bytes = self.num_tokens * np.dtype(self._dtype).itemsize
        self._check_data_size(idx_path, bin_path)
        if not self._skip_warmup:
            _warmup(bin_path)

    def _check_index(self, idx_path: str) -> None:
        n, itemsize = len(self._sizes), np.dtype(self._dtype).itemsize
        if n and self._sizes.min() < 0:
            raise ValueError(f"{idx_path}: item sizes must be >= 0, found {self._sizes.min()}")
        expected = np.zeros(n, dtype=np.int64)
        np.cumsum(self._sizes[:-1], out=expected[1:])
        expected *= itemsize
        if not np.array_equal(expected, self._pointers):
            bad = int(np.flatnonzero(expected != self._pointers)[0])
            raise ValueError(f"{idx_path}: pointer of item {bad} should be byte {expected[bad]} "
                             f"(items stored back to back), found {self._pointers[bad]}")
        d = self._doc_idx
        if len(d) == 0 or d[0] != 0 or d[-1] != n or (len(d) > 1 and np.any(np.diff(d) < 0)):
            raise ValueError(f"{idx_path}: document index must rise from 0 to the item count {n}, "
                             f"found {len(d)} entries starting {d[:3].tolist()} "
                             f"ending {d[-3:].tolist()}")

    def _check_data_size(self, idx_path: str, bin_path: str) -> None:
        expected, found = self._bin_bytes, os.fstat(self._bin_file.fileno()).st_size
        if found != expected:
            kind = "truncated" if found < expected else "longer than its index"
            raise ValueError(
                f"{bin_path} is {kind}: {idx_path} describes {self.num_tokens} tokens of "
                f"{np.dtype(self._dtype).name} = {expected} bytes, found {found} bytes. The pair "
                "does not belong together or a write was interrupted; rebuild it."
            )

    def check_sizes(self) -> None:
        """Raise `TokenFileChanged` if a file this dataset reads no longer has the size its index
        gives (A16: a file truncated or rewritten under a running job), naming both sizes."""
        for path, file, expected in ((index_file_path(self._path), self._idx_file,
                                      self._idx_bytes),
                                     (data_file_path(self._path), self._bin_file,
                                      self._bin_bytes)):
            found = os.fstat(file.fileno()).st_size
            if found != expected:
                how = "shrank" if found < expected else "grew"
                raise TokenFileChanged(
                    f"{path} {how} while training read it: expected {expected} bytes (as when "
                    f"it was opened), found {found} bytes. It was truncated or rewritten in "
                    "place; restore the original file and resume from the last checkpoint, "
                    "or set allow_data_change: true to resume on the new data")

    # -- pickling (DataLoader workers started with spawn re-open the files) --------------------
    def __getstate__(self) -> dict:
        return {"path": self._path, "skip_warmup": True,
                "opened_fingerprint": self.opened_fingerprint}

    def __setstate__(self, state: dict) -> None:
        self._path, self._skip_warmup = state["path"], state["skip_warmup"]
        self._open()
        self.opened_fingerprint = state["opened_fingerprint"]

    # -- access --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._sizes)

    def __getitem__(self, idx: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("slices of an indexed dataset must be contiguous (step 1)")
            if stop <= start:
                return []
            self._check_index_size()
            sizes = self._sizes[start:stop]
            chunk = self._read(int(self._pointers[start]), int(sizes.sum(dtype=np.int64)))
            return np.split(chunk, np.cumsum(sizes[:-1]))
        return self.get(idx)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens [offset, offset + length) of item `idx` (to its end when length is None)."""
        n = len(self)
        i = int(idx)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"item {idx} out of range for {self._path} with {n} items")
        self._check_index_size()
        size = int(self._sizes[i])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens [{offset}, {offset + length}) out of range for item {i} "
                             f"of {self._path}, which has {size} tokens")
        return self._read(int(self._pointers[i]) + offset * np.dtype(self._dtype).itemsize,
                          length)

    def _check_index_size(self) -> None:
        """One fstat before reading the mapped `.idx`: were it shorter now, reading it would
        kill the process with SIGBUS (A16)."""
        if os.fstat(self._idx_file.fileno()).st_size != self._idx_bytes:
            self.check_sizes()

    def _read(self, byte_offset: int, count: int) -> np.ndarray:
        """`count` tokens of the `.bin` from `byte_offset`; `TokenFileChanged` if it shrank."""
        out = np.empty(count, dtype=self._dtype)
        buffer = memoryview(out).cast("B")
        done = 0
        while done < len(buffer):
            n = os.preadv(self._bin_file.fileno(), [buffer[done:]], byte_offset + done)
            if n == 0:
                self.check_sizes()
                raise TokenFileChanged(f"{data_file_path(self._path)}: could read only "
                                       f"{byte_offset + done} bytes of a file of "
                                       f"{self._bin_bytes} bytes")
            done += n
        out.flags.writeable = False
        return out

    @property
    def path(self) -> str:
        return self._path

    @property
    def sizes(self) -> np.ndarray:
        """int32[N]: tokens in each item."""
        return self._sizes

    @property
    def pointers(self) -> np.ndarray:
        """int64[N]: byte offset of each item in the `.bin`."""
        return self._pointers

    @property
    def doc_idx(self) -> np.ndarray:
        """int64[D]: item index where each document starts, ending with N."""
        return self._doc_idx

    @property
    def dtype(self) -> type:
        return self._dtype

    @property
    def num_tokens(self) -> int:
        return int(self._sizes.sum(dtype=np.int64))

    @property
    def supports_prefetch(self) -> bool:
        return False

    @staticmethod
    def exists(path: str) -> bool:
        return os.path.isfile(index_file_path(path)) and os.path.isfile(data_file_path(path))

    # -- integrity -----------------------------------------------------------------------------
    def max_token_id(self, chunk_tokens: int = 1 << 26) -> int:
        """Largest token id in the `.bin` (-1 when empty), scanned in chunks."""
        best, itemsize = -1, np.dtype(self._dtype).itemsize
        for start in range(0, self.num_tokens, chunk_tokens):
            chunk = self._read(start * itemsize, min(chunk_tokens, self.num_tokens - start))
            best = max(best, int(chunk.max()))
        return best

    def check_token_ids(self, vocab_size: int, top: int | None = None) -> None:
        """Raise if any token id is >= `vocab_size` (A12: the data fits the model's vocabulary);
        `top`: the largest id where it is known (megatron.data.token_ids keeps it)."""
        top = self.max_token_id() if top is None else top
        if top >= vocab_size:
            raise ValueError(
                f"{data_file_path(self._path)} holds token id {top}, but the model's vocabulary "
                f"has {vocab_size} entries (ids 0..{vocab_size - 1}). The data was tokenized with "
                "a different tokenizer; re-run preprocessing or fix the tokenizer settings."
            )

    def fingerprint(self) -> dict:
        """What the pair holds, as a JSON-safe dict (A16, A17): sizes, dtype, counts, the sha256
        of the whole `.idx` and of sampled blocks of the `.bin` (see `content_hash`; the whole
        `.bin`'s is `verify_checksum()`). Modification times are not part of it."""
        idx_path, bin_path = index_file_path(self._path), data_file_path(self._path)
        return {
            "prefix": self._path,
            "idx_bytes": os.path.getsize(idx_path),
            "bin_bytes": os.path.getsize(bin_path),
            "idx_sha256": content_hash.full_sha256(idx_path),
            "bin_sample": content_hash.sample_description(),
            "bin_sampled_sha256": content_hash.sampled_sha256(bin_path),
            "dtype": np.dtype(self._dtype).name,
            "num_documents": len(self._doc_idx) - 1,
            "num_tokens": self.num_tokens,
        }

    def verify_checksum(self, expected_sha256: str | None = None) -> str:
        """Full sha256 of the `.bin`; raises when `expected_sha256` is given and differs."""
        digest = content_hash.full_sha256(data_file_path(self._path))
        if expected_sha256 is not None and digest != expected_sha256:
            raise ValueError(f"{data_file_path(self._path)}: expected sha256 {expected_sha256}, "
                             f"found {digest}; the token file was modified or corrupted")
        return digest


def make_dataset(path: str, impl: str = "mmap", skip_warmup: bool = True) -> MMapIndexedDataset:
    """Open the dataset at `path` (only the "mmap" implementation exists)."""
    if impl not in ("mmap", "infer"):
        raise ValueError(f"data_impl {impl!r} is not supported; use 'mmap'")
    return MMapIndexedDataset(path, skip_warmup=skip_warmup)


def _warmup(path: str) -> None:
    """Read the file once so the page cache holds it."""
    with open(path, "rb") as f:
        while f.read(100 << 20):
            pass


# ----------------------------------------------------------------------------------------------
# Writer
# ----------------------------------------------------------------------------------------------


class MMapIndexedDatasetBuilder:
    """Writes a `.bin`/`.idx` pair item by item; nothing appears under the final names until
    `finalize`, which renames both temporary files into place (the old `.idx` is removed first, so
    an interrupted finalize leaves an unpaired `.bin`, never a pair that looks complete).

    Every item is checked to fit `dtype` (A12): an out-of-range id raises, naming the id, the
    dtype and the file.
    """

    def __init__(self, out_file: str, dtype: Any = np.int64, values: str = "tokens"):
        if values not in VALUE_KINDS:
            raise ValueError(f"values must be one of {sorted(VALUE_KINDS)}, got {values!r}")
        self._out_file = str(out_file)
        self._values = values
        self._dtype = np.dtype(VALUE_KINDS[values] or dtype).type
        if values == "tokens" and not np.issubdtype(self._dtype, np.integer):
            raise ValueError(f"token dtype {np.dtype(self._dtype).name} cannot be written; token "
                             "ids are integers")
        dtype_code(self._dtype)  # refuse dtypes the format cannot name
        self._tmp_suffix = f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._tmp_bin = self._out_file + self._tmp_suffix
        self._file = open(self._tmp_bin, "xb", buffering=WRITE_BUFFER_BYTES)
        self._sizes: list[int] = []
        self._doc_idx: list[int] = [0]

    @property
    def dtype(self) -> type:
        return self._dtype

    def add_item(self, tokens: Any) -> None:
        """Append one item (list, numpy array or torch tensor of token ids)."""
        array = self._checked(tokens, f"item {len(self._sizes)}")
        if array.size > np.iinfo(np.int32).max:
            raise ValueError(f"{self._out_file}: item of {array.size} tokens exceeds int32 sizes")
        self._file.write(memoryview(array))
        self._sizes.append(int(array.size))

    def add_documents(self, tokens: Any, lengths: Any) -> None:
        """Append len(lengths) documents of one item each; `tokens` holds their ids back to back.

        The fast path for bulk writers: one range check and one write for many documents.
        """
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        first = len(self._sizes)
        array = self._checked(tokens, f"items {first}..{first + len(lengths) - 1}")
        if lengths.size and (lengths.min() < 0 or lengths.max() > np.iinfo(np.int32).max):
            raise ValueError(f"{self._out_file}: document lengths must be in 0..2**31-1, got "
                             f"{lengths.min()}..{lengths.max()}")
        if int(lengths.sum()) != array.size:
            raise ValueError(f"{self._out_file}: {len(lengths)} document lengths sum to "
                             f"{int(lengths.sum())} but {array.size} tokens were given")
        self._file.write(memoryview(array))
        self._sizes.extend(lengths.tolist())
        self._doc_idx.extend(range(first + 1, len(self._sizes) + 1))

    def _checked(self, tokens: Any, where: str) -> np.ndarray:
        """`tokens` as a contiguous 1-D array of the file's dtype, every id checked to fit (A12)."""
        if hasattr(tokens, "detach"):  # torch tensor, without importing torch here
            tokens = tokens.detach().cpu().numpy()
        array = np.asarray(tokens).reshape(-1)
        if array.size == 0:
            return np.empty(0, dtype=self._dtype)
        if self._values == "rewards":
            if not np.all(np.isfinite(array.astype(np.float64))):
                raise ValueError(f"{self._out_file}: rewards in {where} must be finite numbers")
            return np.ascontiguousarray(array, dtype=self._dtype)
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"{self._out_file}: token ids must be integers, got {array.dtype}")
        info = np.iinfo(self._dtype)
        if self._values == "labels":
            bad = array[(array < 0) & (array != IGNORE_LABEL)]
            if bad.size:
                raise ValueError(f"{self._out_file}: label {int(bad[0])} in {where} is neither a "
                                 f"token id (>= 0) nor {IGNORE_LABEL} (no loss)")
            array = np.where(array == IGNORE_LABEL, 0, array)  # for the range check below
        lo, hi = int(array.min()), int(array.max())
        if lo < max(info.min, 0) or hi > info.max:
            bad = lo if lo < max(info.min, 0) else hi
            raise ValueError(
                f"{self._out_file}: token id {bad} in {where} does not fit "
                f"{np.dtype(self._dtype).name} (ids must be in 0..{info.max}); build with a "
                "vocab_size that covers the tokenizer's largest id"
            )
        return np.ascontiguousarray(np.asarray(tokens).reshape(-1), dtype=self._dtype)

    def end_document(self) -> None:
        """Mark the items added since the last call as one document."""
        self._doc_idx.append(len(self._sizes))

    def merge_file_(self, another_file: str) -> None:
        """Append every item and document of the dataset at prefix `another_file`."""
        other = MMapIndexedDataset(another_file)
        if other.dtype != self._dtype:
            raise ValueError(f"cannot merge {another_file} ({np.dtype(other.dtype).name}) into "
                             f"{self._out_file} ({np.dtype(self._dtype).name}): dtypes differ")
        base = len(self._sizes)
        self._sizes.extend(other.sizes.tolist())
        self._doc_idx.extend((other.doc_idx[1:] + base).tolist())
        with open(data_file_path(another_file), "rb") as src:
            shutil.copyfileobj(src, self._file)

    def finalize(self, index_file: str) -> None:
        """Write the index and move both files into place."""
        index_file = str(index_file)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        tmp_idx = index_file + self._tmp_suffix
        try:
            with open(tmp_idx, "wb") as f:
                f.write(encode_index(self._sizes, self._doc_idx, self._dtype))
                f.flush()
                os.fsync(f.fileno())
            if os.path.exists(index_file):
                os.remove(index_file)
            os.replace(self._tmp_bin, self._out_file)
            os.replace(tmp_idx, index_file)
        except BaseException:
            _remove_quietly(tmp_idx)
            raise
        _fsync_dir(os.path.dirname(os.path.abspath(index_file)))

    def abort(self) -> None:
        """Close and delete the temporary file without touching the final names."""
        if not self._file.closed:
            self._file.close()
        _remove_quietly(self._tmp_bin)

    def __enter__(self) -> "MMapIndexedDatasetBuilder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def encode_index(sizes: Sequence[int], doc_idx: Sequence[int], dtype: Any) -> bytes:
    """The complete `.idx` bytes for items of `sizes` tokens and the document index `doc_idx`."""
    sizes_arr = np.asarray(sizes, dtype=np.int32)
    pointers = np.zeros(len(sizes_arr), dtype=np.int64)
    np.cumsum(sizes_arr[:-1], out=pointers[1:])
    pointers *= np.dtype(dtype).itemsize
    head = MAGIC + struct.pack("<QBQQ", VERSION, dtype_code(dtype), len(sizes_arr), len(doc_idx))
    return b"".join([head, sizes_arr.astype("<i4").tobytes(), pointers.astype("<i8").tobytes(),
                     np.asarray(doc_idx, dtype="<i8").tobytes()])


def make_builder(out_file: str, impl: str = "mmap",
                 vocab_size: int | None = None) -> MMapIndexedDatasetBuilder:
    """A builder writing `out_file` (the `.bin` path) with the dtype that fits `vocab_size`."""
    if impl != "mmap":
        raise ValueError(f"data_impl {impl!r} is not supported; use 'mmap'")
    return MMapIndexedDatasetBuilder(out_file, dtype=best_fitting_dtype(vocab_size))


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
