"""Ready-to-train dataset recipes: `builtin` (offline) and `enwik8` (downloads).

`prepare_builtin(data_dir)` writes `data_dir/builtin/`:
    builtin.jsonl                          the corpus (see `builtin_corpus`)
    tokenizer.json                         byte-level BPE trained on it (HFTokenizer)
    builtin_text_document.bin / .idx       the corpus tokenized, EOD after each document
    manifest.json                          hashes tying the three together
A step is redone only when its output is missing or invalid or what it was built from changed
(checked through the manifest), or with `force`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import urllib.request
import zipfile
from dataclasses import asdict, dataclass
from typing import Callable

from megatron.data import builtin_corpus
from megatron.data.indexed_dataset import MMapIndexedDataset, data_file_path, index_file_path
from megatron.data.preprocess import preprocess
from megatron.monitoring.logger import get_logger
from megatron.paths import make_output_dir

logger = get_logger(__name__)

BUILTIN_VOCAB_SIZE = 8192
ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"


@dataclass
class PreparedData:
    """Where a recipe put its files; `data_prefix` is what `data_path` takes."""

    directory: str
    corpus: str
    tokenizer_type: str
    vocab_file: str | None
    data_prefix: str


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _read_manifest(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write_json(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def _tokens_valid(prefix: str, vocab_size: int) -> str | None:
    """Sha256 of the index when the token pair opens and fits the vocabulary, else None."""
    try:
        dataset = MMapIndexedDataset(prefix)
        dataset.check_token_ids(vocab_size)
    except (OSError, ValueError) as err:
        if os.path.exists(index_file_path(prefix)) or os.path.exists(data_file_path(prefix)):
            logger.warning("rebuilding %s: %s", prefix, err)
        return None
    return dataset.opened_fingerprint["idx_sha256"]


def _read_texts(jsonl: str) -> list[str]:
    with open(jsonl, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def prepare_builtin(data_dir: str, vocab_size: int = BUILTIN_VOCAB_SIZE, force: bool = False,
                    max_documents: int | None = None, workers: int = 1) -> PreparedData:
    """Build (or reuse) the built-in corpus, tokenizer and token files under `data_dir/builtin`.

    `max_documents` keeps only the corpus's first documents (for quick tests).
    """
    from megatron.tokenizer import build_tokenizer
    from megatron.tokenizer.train_bpe import train_bpe_tokenizer

    out = os.path.join(data_dir, "builtin")
    make_output_dir(out, "--data-dir")
    corpus, tok_path = os.path.join(out, "builtin.jsonl"), os.path.join(out, "tokenizer.json")
    prefix = os.path.join(out, "builtin")
    data_prefix = f"{prefix}_text_document"
    manifest_path = os.path.join(out, "manifest.json")
    manifest = {} if force else _read_manifest(manifest_path)
    wanted = {"vocab_size": vocab_size, "max_documents": max_documents}
    same_settings = all(manifest.get(k) == v for k, v in wanted.items())

    redo = force or not os.path.isfile(corpus) or not same_settings
    if redo:
        _write_corpus(corpus, max_documents)
    corpus_sha = _sha256(corpus)

    redo = redo or not os.path.isfile(tok_path) or manifest.get("corpus_sha256") != corpus_sha
    if not redo:
        try:
            tokenizer = build_tokenizer("HFTokenizer", tok_path)
        except (OSError, ValueError) as err:
            logger.warning("rebuilding %s: %s", tok_path, err)
            redo = True
    if redo:
        train_bpe_tokenizer(_read_texts(corpus), vocab_size, tok_path)
        tokenizer = build_tokenizer("HFTokenizer", tok_path)
    tok_sha = _sha256(tok_path)

    idx_sha = None if redo else _tokens_valid(data_prefix, tokenizer.vocab_size)
    if idx_sha is None or manifest.get("tokenizer_sha256") != tok_sha \
            or manifest.get("idx_sha256") != idx_sha:
        preprocess(corpus, prefix, "HFTokenizer", tok_path, append_eod=True, workers=workers)
        idx_sha = _tokens_valid(data_prefix, tokenizer.vocab_size)
        assert idx_sha is not None, "freshly written token files failed their checks"
    else:
        logger.info("reusing %s (up to date)", data_prefix)
    _write_json(manifest_path, {**wanted, "corpus_sha256": corpus_sha,
                                "tokenizer_sha256": tok_sha, "idx_sha256": idx_sha})
    return PreparedData(out, corpus, "HFTokenizer", tok_path, data_prefix)


def _write_corpus(path: str, max_documents: int | None) -> None:
    if max_documents is None:
        builtin_corpus.write_corpus(path)
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for _, doc in zip(range(max_documents), builtin_corpus.iter_documents()):
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


# -- enwik8 ----------------------------------------------------------------------------------------


def download(url: str, dest: str, timeout: float = 60.0) -> None:
    """Fetch `url` to `dest` through a temporary file (no partial file under `dest`)."""
    tmp = f"{dest}.tmp-{os.getpid()}"
    logger.info("downloading %s -> %s", url, dest)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as f:
            shutil.copyfileobj(response, f)
        os.replace(tmp, dest)
    except OSError as err:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise RuntimeError(f"cannot download {url}: {err}. Check the network, or place the "
                           f"file at {dest} yourself") from err


def split_enwik8_pages(raw: bytes) -> list[str]:
    """enwik8's XML cut into documents at each "<page>" (the header before the first is one)."""
    text = raw.decode("utf-8", errors="replace")
    pieces = text.split("<page>")
    docs = [pieces[0]] + ["<page>" + p for p in pieces[1:]]
    return [d for d in docs if d.strip()]


def prepare_enwik8(data_dir: str, force: bool = False, url: str = ENWIK8_URL,
                   workers: int = 1) -> PreparedData:
    """Download enwik8 (100 MB of Wikipedia XML), split it into pages, tokenize it by bytes."""
    out = os.path.join(data_dir, "enwik8")
    make_output_dir(out, "--data-dir")
    archive, corpus = os.path.join(out, "enwik8.zip"), os.path.join(out, "enwik8.jsonl")
    prefix = os.path.join(out, "enwik8")
    data_prefix = f"{prefix}_text_document"
    if force or not os.path.isfile(archive):
        download(url, archive)
    if force or not os.path.isfile(corpus):
        with zipfile.ZipFile(archive) as zf:
            raw = zf.read("enwik8")
        tmp = f"{corpus}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            for doc in split_enwik8_pages(raw):
                f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
        os.replace(tmp, corpus)
        force = True  # the token files must follow the new corpus
    if force or _tokens_valid(data_prefix, 512) is None:
        preprocess(corpus, prefix, "CharLevelTokenizer", append_eod=True, workers=workers)
    return PreparedData(out, corpus, "CharLevelTokenizer", None, data_prefix)


RECIPES: dict[str, Callable[..., PreparedData]] = {
    "builtin": prepare_builtin,
    "enwik8": prepare_enwik8,
}


def prepare_dataset(name: str, data_dir: str, **kwargs) -> PreparedData:
    """Run the recipe `name` into `data_dir`."""
    if name not in RECIPES:
        raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(RECIPES)}")
    result = RECIPES[name](data_dir, **kwargs)
    logger.info("%s ready: %s", name, json.dumps(asdict(result)))
    return result
