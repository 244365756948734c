"""The largest token id of a token file, remembered beside the index caches (A12).

    check_token_ids(dataset, vocab_size, cache_dir)   # ValueError naming the .bin, id and size

Finding the largest id reads the whole `.bin` (a minute or more per 100 GB). `deepy.py` does it
before any worker starts, and every worker did it again at each start, so the result is kept in
a small JSON file in the run's `data_cache_dir` (default: the data's own folder, as for the
sample-index caches): `<name>_max_token_id_<key>.json`. Its key is the token file's content
fingerprint (sizes, dtype, counts, sha256 of the whole `.idx` and of sampled blocks of the
`.bin`; A16), so data rebuilt from other documents or with another tokenizer has another key
and is read again; the file also holds the fingerprint, compared in full when it is read. An
edit in place between the sampled blocks that keeps every length is not seen, as for A17's
sampled fingerprint. A folder that cannot be written is no error: the scan is then not kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time

from megatron.data.indexed_dataset import MMapIndexedDataset, data_file_path
from megatron.monitoring.logger import get_logger

logger = get_logger(__name__)

CACHE_FORMAT = 1
KEY_FIELDS = ("idx_bytes", "bin_bytes", "idx_sha256", "bin_sample", "bin_sampled_sha256",
              "dtype", "num_documents", "num_tokens")
ANNOUNCED_BYTES = 1 << 30  # a scan of a larger .bin is announced before it starts


def cache_folder(prefix: str, cache_dir: str | None) -> str:
    """Where a run's caches for `prefix` live: `cache_dir`, else the data's own folder."""
    return cache_dir if cache_dir is not None else os.path.dirname(os.path.abspath(prefix))


def cache_path(dataset: MMapIndexedDataset, cache_dir: str | None) -> str:
    """The JSON file that holds `dataset`'s largest id, for its content as opened."""
    content = {k: dataset.opened_fingerprint.get(k) for k in KEY_FIELDS}
    key = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
    name = f"{os.path.basename(dataset.path)}_max_token_id_{key}.json"
    return os.path.join(cache_folder(dataset.path, cache_dir), name)


def largest_token_id(dataset: MMapIndexedDataset, cache_dir: str | None) -> int:
    """`dataset.max_token_id()`, read from the cache when it holds this content, else scanned
    and kept there."""
    path = cache_path(dataset, cache_dir)
    content = {k: dataset.opened_fingerprint.get(k) for k in KEY_FIELDS}
    cached = _read(path)
    if cached is not None and cached.get("fingerprint") == content:
        return int(cached["max_token_id"])
    size = dataset.opened_fingerprint["bin_bytes"]
    if size >= ANNOUNCED_BYTES:
        logger.info("reading %s (%.1f GiB) for its largest token id (A12); kept in %s",
                    data_file_path(dataset.path), size / 2**30, path)
    start = time.perf_counter()
    top = dataset.max_token_id()
    logger.debug("largest token id of %s: %d (%.1f s)", dataset.path, top,
                 time.perf_counter() - start)
    _write(path, {"format": CACHE_FORMAT, "max_token_id": top, "fingerprint": content})
    return top


def check_token_ids(dataset: MMapIndexedDataset, vocab_size: int, cache_dir: str | None) -> None:
    """Raise if any token id of `dataset` is >= `vocab_size` (A12), scanning it only when the
    cache does not know its content."""
    dataset.check_token_ids(vocab_size, top=largest_token_id(dataset, cache_dir))


def _read(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            payload = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(payload, dict) or payload.get("format") != CACHE_FORMAT or \
            not isinstance(payload.get("max_token_id"), int):
        return None
    return payload


def _write(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp-{socket.gethostname()}-{os.getpid()}"  # ranks of other nodes write too
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(payload, f, sort_keys=True)
        os.replace(tmp, path)  # ranks that scanned at once write the same content
    except OSError as err:
        logger.debug("cannot keep the largest token id in %s (%s)", path, err)
        try:
            os.remove(tmp)
        except OSError:
            pass
