"""Tokenize documents (jsonl, jsonl.gz, jsonl.zst, json.zst, txt) into
`{prefix}_{key}_document.bin/.idx` files.

    result = preprocess("data/a.jsonl", "data/a", "HFTokenizer", "tokenizer.json",
                        append_eod=True, workers=4)   # data/a_text_document.bin/.idx

The inputs, and what a document of each kind of file is, are megatron/data/preprocess_inputs.py's
(`expand_inputs`, `iter_documents`); each requested key becomes its own token file. `ftfy=True`
needs the optional `ftfy` package (requirements/requirements-data.txt).

Documents are tokenized in batches of about `BATCH_CHARS` characters, by `workers` processes when
> 1, each using one thread (`tokenizers`' own thread pool is switched off, so `workers` is the
number of cores used); a batch comes back as one token array, written with one call, in input
order. Empty documents are skipped, as GPT-NeoX does.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from megatron.data.indexed_dataset import (MMapIndexedDatasetBuilder, best_fitting_dtype,
                                           data_file_path, index_file_path)
from megatron.data.preprocess_inputs import expand_inputs, iter_documents, require_package
from megatron.monitoring.logger import get_logger
from megatron.paths import make_output_dir
from megatron.monitoring.progress import progress
from megatron.tokenizer import AbstractTokenizer, build_tokenizer

logger = get_logger(__name__)

# Documents go to the tokenizer (and to a worker process) in batches of about this many
# characters: big enough that sending them costs little, small enough to keep workers balanced.
BATCH_CHARS = 1 << 18
BATCH_DOCS = 4096
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"


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
    key_tokens: dict[str, int] = field(default_factory=dict)  # tokens written per key

    def written(self, key: str) -> str:
        """What the token file of `key` holds, for the tool's summary line."""
        skipped = self.skipped_empty.get(key, 0)
        empty = f", {skipped} empty skipped" if skipped else ""
        return (f"{self.documents - skipped} documents, {self.key_tokens.get(key, 0)} tokens"
                f"{empty}, {self.dtype}")


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
            result.key_tokens[key] = result.key_tokens.get(key, 0) + len(tokens)
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
