"""Tokenize documents (jsonl, jsonl.gz, jsonl.zst, json.zst, txt) into
`{prefix}_{key}_document.bin/.idx` files.

Inputs may be files or directories (searched recursively, sorted) and a comma-separated list of
either. A jsonl line is one document; each requested key becomes its own token file. A `.txt`
file is one document. A `.json.zst` file (lm_dataformat's JSON archive, which GPT-NeoX reads)
is one JSON array whose strings are documents. The `.zst` files need the optional `zstandard`
package, `ftfy=True` the `ftfy` package (requirements/requirements-data.txt).

Documents are tokenized in batches of about `BATCH_CHARS` characters, by `workers` processes when
> 1, each using one thread (`tokenizers`' own thread pool is switched off, so `workers` is the
number of cores used); a batch comes back as one token array, written with one call, in input
order. Empty documents are skipped, as GPT-NeoX does.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import io
import itertools
import json
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from megatron.data.indexed_dataset import (MMapIndexedDatasetBuilder, best_fitting_dtype,
                                           data_file_path, index_file_path)
from megatron.monitoring.logger import get_logger
from megatron.paths import make_output_dir
from megatron.monitoring.progress import progress
from megatron.tokenizer import AbstractTokenizer, build_tokenizer

logger = get_logger(__name__)

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
JSON_ARRAY_SUFFIXES = (".json.zst",)
TEXT_SUFFIXES = (".txt", ".txt.gz")
INPUT_SUFFIXES = JSONL_SUFFIXES + JSON_ARRAY_SUFFIXES + TEXT_SUFFIXES
# lm_dataformat archives that GPT-NeoX reads and this project does not
ARCHIVE_SUFFIXES = (".jsonl.zst.tar", ".dat.zst", ".tar.gz", ".zip", ".json.gz", ".xz")
DATA_INSTALL = "pip install -r requirements/requirements-data.txt"
ZSTD_CHUNK = 1 << 20  # compressed bytes read from a .zst file at a time
# Documents go to the tokenizer (and to a worker process) in batches of about this many
# characters: big enough that sending them costs little, small enough to keep workers balanced.
BATCH_CHARS = 1 << 18
BATCH_DOCS = 4096
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"


def require_package(module: str, purpose: str):
    """The optional package `module`, imported; missing, an ImportError names `purpose` (what
    needs it) and the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{purpose} needs the {module} package, which is not installed: "
                          f"{DATA_INSTALL}") from None


class FixedTextTokenizer:
    """`tokenizer` with every text run through ftfy.fix_text before it is tokenized (--ftfy of
    the tools that take a tokenizer object); it pickles, so worker processes can use it."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._fix_text = require_package("ftfy", "--ftfy").fix_text

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.tokenize(self._fix_text(text))

    def tokenize_batch(self, texts: list[str]) -> list:
        return self._tokenizer.tokenize_batch([self._fix_text(t) for t in texts])

    def __getattr__(self, name: str):  # eod, vocab_size, ... of the wrapped tokenizer
        if name.startswith("__") or name == "_tokenizer":  # (unpickling: not set yet)
            raise AttributeError(name)
        return getattr(self._tokenizer, name)


def expand_inputs(inputs: str | Sequence[str]) -> list[str]:
    """Input files from paths, directories and comma-separated lists, in a fixed order."""
    items = inputs.split(",") if isinstance(inputs, str) else list(inputs)
    files: list[str] = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        if os.path.isdir(item):
            found = sorted(
                os.path.join(root, name) for root, _, names in os.walk(item) for name in names
                if name.endswith(INPUT_SUFFIXES))
            if not found:
                raise FileNotFoundError(f"input directory {item} holds no "
                                        f"{', '.join(INPUT_SUFFIXES)} files")
            files.extend(found)
        elif os.path.isfile(item):
            if not item.endswith(INPUT_SUFFIXES):
                hint = (" (an lm_dataformat archive: unpack it into .jsonl or .txt files first)"
                        if item.endswith(ARCHIVE_SUFFIXES) else "")
                raise ValueError(f"input {item}: unsupported file type{hint}; use "
                                 f"{', '.join(INPUT_SUFFIXES)}")
            files.append(item)
        else:
            raise FileNotFoundError(f"input {item} does not exist")
    if not files:
        raise ValueError("no input files given")
    compressed = [f for f in files if f.endswith(".zst")]
    if compressed:  # refused before any output is written
        require_package("zstandard", f"reading {compressed[0]}")
    return files


class _ZstdReader(io.RawIOBase):
    """The decompressed bytes of a .zst file, frame after frame. A corrupt file, or one that
    ends inside a frame (cut short), raises ValueError naming it."""

    def __init__(self, path: str):
        super().__init__()
        zstandard = require_package("zstandard", f"reading {path}")
        self._path, self._error = path, zstandard.ZstdError
        self._new_frame = zstandard.ZstdDecompressor().decompressobj
        self._frame = None  # the decompressor of the frame under way, None between frames
        self._frames = 0
        self._out = memoryview(b"")
        self._file = open(path, "rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not len(self._out):
            if not self._decompress_chunk():
                return 0
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _decompress_chunk(self) -> bool:
        """Decompress the next chunk of the file into `_out`; False at its end."""
        chunk = self._file.read(ZSTD_CHUNK)
        if not chunk:
            if self._frame is not None or self._frames == 0:
                raise ValueError(f"{self._path} ends before its zstd data does (the file is cut "
                                 "short, or empty); write it again")
            return False
        parts = []
        while chunk:
            if self._frame is None:
                self._frame = self._new_frame()
            try:
                parts.append(self._frame.decompress(chunk))
            except self._error as err:
                raise ValueError(f"{self._path} is not valid zstd data ({err}); write it again "
                                 "with zstd, or rename it without .zst if it is not "
                                 "compressed") from None
            chunk = b""
            if self._frame.eof:  # a frame ended; what follows it starts the next one
                chunk, self._frame = self._frame.unused_data, None
                self._frames += 1
        self._out = memoryview(b"".join(parts))
        return True

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()


def _decompressed_text(path: str):
    """`path` opened as UTF-8 text, decompressed by its suffix (.gz, .zst)."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    if path.endswith(".zst"):
        return io.TextIOWrapper(io.BufferedReader(_ZstdReader(path), ZSTD_CHUNK),
                                encoding="utf-8")
    return open(path, encoding="utf-8")


def _open_text(path: str):
    """A text file or one JSON record per line (jsonl), decompressed by its suffix."""
    if path.endswith(JSON_ARRAY_SUFFIXES):
        raise ValueError(f"{path} holds one JSON array of documents, and this reads one JSON "
                         "record per line (prompt/completion fields, chat messages): write its "
                         "records one per line as .jsonl or .jsonl.zst")
    return _decompressed_text(path)


def iter_documents(files: Sequence[str], keys: Sequence[str]) -> Iterator[dict[str, str]]:
    """{key: text} per document of `files`."""
    for path in files:
        if path.endswith(TEXT_SUFFIXES):
            if len(keys) != 1:
                raise ValueError(f"{path}: a .txt file has one field; ask for one jsonl key")
            with _open_text(path) as f:
                yield {keys[0]: f.read()}
        elif path.endswith(JSON_ARRAY_SUFFIXES):
            yield from _json_array_documents(path, keys)
        else:
            yield from _jsonl_documents(path, keys)


def _record_texts(record, keys: Sequence[str], where: str) -> dict[str, str]:
    """{key: text} of one JSON record (`where` names it in errors); each value must be a
    string."""
    if not isinstance(record, dict):
        raise ValueError(f"{where} is a JSON {type(record).__name__}, "
                         "not an object with the text under a key")
    missing = [k for k in keys if k not in record]
    if missing:
        raise ValueError(f"{where} has no key {missing[0]!r} "
                         f"(it has: {', '.join(map(str, record)) or 'nothing'}); "
                         "set --jsonl-keys")
    for k in keys:
        if not isinstance(record[k], str):
            shown = json.dumps(record[k])
            raise ValueError(f"{where}: {k!r} is {shown[:40]}{'...' if len(shown) > 40 else ''}"
                             ", not a string; fix the line or remove it (it would be tokenized "
                             "as that value's text)")
    return {k: record[k] for k in keys}


def _jsonl_documents(path: str, keys: Sequence[str]) -> Iterator[dict[str, str]]:
    """{key: text} per line of the JSON-lines file `path`."""
    line_no = 0
    try:
        with _open_text(path) as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path} line {line_no} is not valid JSON: {err}") from None
                yield _record_texts(record, keys, f"{path} line {line_no}")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at or after line "
                         f"{line_no + 1}); convert the file to UTF-8") from None
    except gzip.BadGzipFile as err:
        raise ValueError(f"{path} is not a gzip file ({err}); decompress it with the tool that "
                         "made it, or rename it without .gz") from None


def _json_array_documents(path: str, keys: Sequence[str]) -> Iterator[dict[str, str]]:
    """{key: text} per item of the JSON array in `path`, read whole as lm_dataformat does: a
    string is one document (one key only), an object is read like a jsonl record."""
    try:
        with _decompressed_text(path) as f:
            items = json.load(f)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason}); convert it to UTF-8") \
            from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not one JSON array: {err}") from None
    if not isinstance(items, list):
        raise ValueError(f"{path} holds a JSON {type(items).__name__}, not an array of documents")
    for number, item in enumerate(items):
        where = f"{path} item {number}"
        if not isinstance(item, str):
            yield _record_texts(item, keys, where)
        elif len(keys) == 1:
            yield {keys[0]: item}
        else:
            raise ValueError(f"{where} is a string, one field; ask for one --jsonl-keys key")


# -- workers ---------------------------------------------------------------------------------------
_WORKER: dict = {}


def _init_worker(tokenizer_spec: tuple, keys: tuple, append_eod: bool, ftfy: bool,
                 tokenizer: AbstractTokenizer | None = None) -> None:
    _WORKER["tokenizer"] = tokenizer if tokenizer is not None else build_tokenizer(*tokenizer_spec)
    _WORKER["keys"], _WORKER["append_eod"] = keys, append_eod
    _WORKER["fix_text"] = require_package("ftfy", "--ftfy").fix_text if ftfy else None


def _encode_batch(batch: list[dict[str, str]]) -> tuple[dict[str, tuple], int]:
    """{key: (int64 token ids of the batch back to back, tokens per document)} and the batch's
    UTF-8 byte count. Arrays, not lists, so sending them between processes is one copy."""
    tokenizer = _WORKER["tokenizer"]
    encoded: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    nbytes = 0
    for key in _WORKER["keys"]:
        texts = [doc[key] for doc in batch]
        nbytes += sum(len(t.encode("utf-8")) for t in texts)
        if _WORKER["fix_text"] is not None:
            texts = [_WORKER["fix_text"](t) for t in texts]
        ids = tokenizer.tokenize_batch(texts)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        tokens = _concatenate(ids, int(lengths.sum()))
        if _WORKER["append_eod"]:  # after every non-empty document
            ends = np.cumsum(lengths)[lengths > 0]
            tokens = np.insert(tokens, ends, tokenizer.eod)
            lengths += lengths > 0
        encoded[key] = (tokens, lengths)
    return encoded, nbytes


def _concatenate(ids: list, total: int) -> np.ndarray:
    """int64[total]: the token sequences (lists or arrays) back to back, without per-token
    Python objects where the backend returns arrays."""
    if ids and all(isinstance(seq, np.ndarray) for seq in ids):
        return np.concatenate(ids).astype(np.int64, copy=False)
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=total)


def _batches(documents: Iterator[dict[str, str]]) -> Iterator[list[dict[str, str]]]:
    """Lists of documents holding about BATCH_CHARS characters (at most BATCH_DOCS documents)."""
    batch: list[dict[str, str]] = []
    chars = 0
    for doc in documents:
        batch.append(doc)
        chars += sum(map(len, doc.values()))
        if chars >= BATCH_CHARS or len(batch) == BATCH_DOCS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


@contextlib.contextmanager
def _tokenizers_threads_off() -> Iterator[None]:
    """Keep `tokenizers` to one thread per process (its Rayon pool would otherwise use every
    core from `encode_batch`), so `workers` is the number of cores preprocessing uses."""
    old = os.environ.get(TOKENIZERS_PARALLELISM)
    os.environ[TOKENIZERS_PARALLELISM] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(TOKENIZERS_PARALLELISM, None)
        else:
            os.environ[TOKENIZERS_PARALLELISM] = old


@dataclass
class PreprocessResult:
    """What `preprocess` wrote."""

    prefixes: dict[str, str]  # key -> output prefix
    documents: int = 0
    tokens: int = 0
    input_bytes: int = 0
    seconds: float = 0.0
    dtype: str = ""
    skipped_empty: dict[str, int] = field(default_factory=dict)


def preprocess(inputs: str | Sequence[str], output_prefix: str, tokenizer_type: str | None = None,
               vocab_file: str | None = None, merge_file: str | None = None,
               jsonl_keys: Sequence[str] = ("text",), append_eod: bool = False, workers: int = 1,
               log_interval: int = 1000, max_docs: int | None = None,
               tokenizer: AbstractTokenizer | None = None, ftfy: bool = False,
               num_docs: int | None = None) -> PreprocessResult:
    """Tokenize `inputs` into one `{output_prefix}_{key}_document` pair per key.

    Give `tokenizer_type` (+ files), or a built `tokenizer` (then `workers` must be 1). `ftfy`
    runs every text through `ftfy.fix_text` first; `num_docs`, the number of documents the
    input holds, is the progress bar's total.
    """
    if ftfy:  # refused before any output is written
        require_package("ftfy", "--ftfy")
    if tokenizer is None:
        if tokenizer_type is None:
            raise ValueError("preprocess needs tokenizer_type (or a tokenizer object)")
        tokenizer = build_tokenizer(tokenizer_type, vocab_file, merge_file)
    elif workers > 1:
        raise ValueError("pass tokenizer_type instead of a tokenizer object to use workers > 1")
    keys = tuple(jsonl_keys)
    files = expand_inputs(inputs)
    dtype = best_fitting_dtype(tokenizer.max_token_id + 1)
    prefixes = {k: f"{output_prefix}_{k}_document" for k in keys}
    make_output_dir(os.path.dirname(os.path.abspath(output_prefix)), "--output-prefix")
    builders = {k: MMapIndexedDatasetBuilder(data_file_path(p), dtype=dtype)
                for k, p in prefixes.items()}
    result = PreprocessResult(prefixes, dtype=np.dtype(dtype).name,
                              skipped_empty={k: 0 for k in keys})
    documents = iter_documents(files, keys)
    if max_docs is not None:
        documents = (d for i, d in zip(range(max_docs), documents))
    init_args = ((tokenizer_type, vocab_file, merge_file), keys, append_eod, ftfy)
    try:
        with _tokenizers_threads_off():  # inherited by the spawned workers
            _run(documents, builders, result, init_args, workers, tokenizer, log_interval,
                 num_docs)
        for key, builder in builders.items():
            builder.finalize(index_file_path(prefixes[key]))
    except BaseException:
        for builder in builders.values():
            builder.abort()
        raise
    _log_progress(result, num_docs, final=True)
    if num_docs is not None and num_docs != result.documents:
        logger.warning("read %d documents, not the %d that --num-docs gave (it only sets the "
                       "progress bar's total)", result.documents, num_docs)
    if result.documents == 0:
        logger.warning("no documents in %s: the output %s holds none; a dataset of it cannot be "
                       "trained on", ", ".join(files), ", ".join(prefixes.values()))
    return result


def _run(documents, builders, result, init_args: tuple, workers: int, tokenizer,
         log_interval: int, num_docs: int | None) -> None:
    """Tokenize `documents` in this process (workers == 1) or a pool, writing in input order;
    `init_args` are `_init_worker`'s."""
    if workers <= 1:
        _init_worker(*init_args, tokenizer)
        _write_all(map(_encode_batch, _batches(documents)), builders, result, log_interval,
                   num_docs)
        return
    # spawn: no inherited threads (torch, tokenizers' thread pool) in the workers
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=init_args) as pool:
        encoded = pool.imap(_encode_batch, _batches(documents))
        _write_all(encoded, builders, result, log_interval, num_docs)


def _write_all(encoded, builders, result: PreprocessResult, log_interval: int,
               num_docs: int | None) -> None:
    start = time.perf_counter()
    next_log = log_interval
    bar = progress(total=num_docs, desc="tokenizing", unit="doc")
    for batch, nbytes in encoded:
        for key, (tokens, lengths) in batch.items():
            nonempty = lengths > 0
            result.skipped_empty[key] += int(len(lengths) - nonempty.sum())
            builders[key].add_documents(tokens, lengths[nonempty])
            result.tokens += len(tokens)
        result.documents += len(next(iter(batch.values()))[1])
        bar.update(len(next(iter(batch.values()))[1]))
        result.input_bytes += nbytes
        result.seconds = time.perf_counter() - start
        if log_interval and result.documents >= next_log:
            _log_progress(result, num_docs)
            next_log = (result.documents // log_interval + 1) * log_interval
    bar.close()


def _log_progress(result: PreprocessResult, num_docs: int | None = None,
                  final: bool = False) -> None:
    secs = max(result.seconds, 1e-9)
    of = "" if num_docs is None else f"/{num_docs}"
    logger.info("%s %d%s documents, %d tokens in %.1f s (%.0f docs/s, %.0f tokens/s, %.2f MB/s)",
                "done:" if final else "processed", result.documents, of, result.tokens,
                result.seconds, result.documents / secs, result.tokens / secs,
                result.input_bytes / secs / 1e6)
