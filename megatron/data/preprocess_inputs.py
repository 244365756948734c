"""The input files of the preprocessing tools: finding them, decompressing them and reading
their documents.

    files = expand_inputs("data/a.jsonl,data/more/")   # files and folders, in a fixed order
    for doc in iter_documents(files, ["text"]):         # {"text": "..."} per document
        ...

Inputs may be files or directories (searched recursively, sorted) and a comma-separated list of
either. A jsonl line is one document: a JSON object with a string under each requested key.
With the default keys (`text` alone) a line may also take the shapes lm_dataformat reads, as
GPT-NeoX does through it: a bare JSON string is the document, and a list of strings under
`text` is its paragraphs, joined with a blank line ("\\n\\n", lm_dataformat's `para_joiner`).
A `.txt` file is one document. A `.json.zst` file (lm_dataformat's JSON archive) is one JSON
array whose strings are documents. `.gz` files are read with gzip, `.zst` files with the
optional `zstandard` package (requirements/requirements-data.txt). Every error names the file,
and the line (jsonl) or item (json.zst) it is about.
"""

from __future__ import annotations

import gzip
import importlib
import io
import json
import os
from typing import Iterator, Sequence

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
JSON_ARRAY_SUFFIXES = (".json.zst",)
TEXT_SUFFIXES = (".txt", ".txt.gz")
INPUT_SUFFIXES = JSONL_SUFFIXES + JSON_ARRAY_SUFFIXES + TEXT_SUFFIXES
# lm_dataformat archives that GPT-NeoX reads and this project does not
ARCHIVE_SUFFIXES = (".jsonl.zst.tar", ".dat.zst", ".tar.gz", ".zip", ".json.gz", ".xz")
# what else lm_dataformat reads as documents in a folder (GPT-NeoX's --input DIR): a folder
# holding such a file is refused, as skipping it would drop its documents
OTHER_DATA_SUFFIXES = (".gz", ".json", ".csv", ".tsv")
DATA_INSTALL = "pip install -r requirements/requirements-data.txt"
ZSTD_CHUNK = 1 << 20  # compressed bytes read from a .zst file at a time
# The keys with which jsonl lines may take lm_dataformat's shapes: the one key it reads.
LM_DATAFORMAT_KEYS = ("text",)
PARAGRAPH_JOINER = "\n\n"  # lm_dataformat's para_joiner
JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
              float: "number", type(None): "null"}


def require_package(module: str, purpose: str):
    """The optional package `module`, imported; missing, an ImportError names `purpose` (what
    needs it) and the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{purpose} needs the {module} package, which is not installed: "
                          f"{DATA_INSTALL}") from None


def expand_inputs(inputs: str | Sequence[str]) -> list[str]:
    """Input files from paths, directories and comma-separated lists, in a fixed order."""
    items = inputs.split(",") if isinstance(inputs, str) else list(inputs)
    files: list[str] = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        if os.path.isdir(item):
            files.extend(_directory_inputs(item))
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


def _directory_inputs(folder: str) -> list[str]:
    """The input files under `folder`, sorted. Files of the kinds GPT-NeoX reads there and this
    project does not (lm_dataformat's archives, .json, .csv, .tsv, other .gz) are refused by
    name; other files (a README) are skipped with a warning."""
    every = sorted(os.path.join(root, name) for root, _, names in os.walk(folder)
                   for name in names)
    found = [f for f in every if f.endswith(INPUT_SUFFIXES)]
    unread = [f for f in every if not f.endswith(INPUT_SUFFIXES)]
    data = [f for f in unread if f.endswith(ARCHIVE_SUFFIXES + OTHER_DATA_SUFFIXES)]
    if data:
        shown = ", ".join(data[:3]) + (f" and {len(data) - 3} more" if len(data) > 3 else "")
        raise ValueError(f"input directory {folder} holds {len(data)} file(s) of a kind this "
                         f"tool does not read ({shown}), whose documents GPT-NeoX's "
                         f"lm_dataformat would take; convert them into .jsonl or .txt files "
                         f"(lm_dataformat archives: unpack them), or move them out of the folder")
    if not found:
        raise FileNotFoundError(f"input directory {folder} holds no "
                                f"{', '.join(INPUT_SUFFIXES)} files")
    if unread:
        from megatron.monitoring.logger import get_logger

        get_logger(__name__).warning(
            "input directory %s: %d file(s) that are not data are skipped: %s", folder,
            len(unread), ", ".join(unread[:3]) + (" ..." if len(unread) > 3 else ""))
    return found


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


def open_text(path: str):
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
            with open_text(path) as f:
                yield {keys[0]: f.read()}
        elif path.endswith(JSON_ARRAY_SUFFIXES):
            yield from _json_array_documents(path, keys)
        else:
            yield from _jsonl_documents(path, keys)


def json_type(value) -> str:
    """JSON's name for the type of a parsed value (object, array, string, ...)."""
    return JSON_TYPES.get(type(value), type(value).__name__)


def _record_texts(record, keys: Sequence[str], where: str) -> dict[str, str]:
    """{key: text} of one JSON record (`where` names it in errors): an object with a string
    under every key, or with the default keys one of lm_dataformat's shapes (module
    docstring)."""
    lm_shapes = tuple(keys) == LM_DATAFORMAT_KEYS
    if isinstance(record, str) and lm_shapes:
        return {keys[0]: record}
    if not isinstance(record, dict):
        raise ValueError(_not_an_object(record, keys, where))
    missing = [k for k in keys if k not in record]
    if missing:
        raise ValueError(f"{where} has no key {missing[0]!r} "
                         f"(it has: {', '.join(map(str, record)) or 'nothing'}); "
                         "set --jsonl-keys")
    return {k: _field_text(record[k], k, lm_shapes, where) for k in keys}


def _not_an_object(record, keys: Sequence[str], where: str) -> str:
    """The error for a record that is not a JSON object."""
    said = f"{where} is a JSON {json_type(record)}, not an object with the text under a key"
    if isinstance(record, str):
        return (f"{said}: a bare string is a document only with the default --jsonl-keys text "
                f"(lm_dataformat's shape), not with --jsonl-keys {' '.join(keys)}")
    if isinstance(record, list) and tuple(keys) == LM_DATAFORMAT_KEYS:
        return (f"{said} (lm_dataformat refuses an array line too): write one document per "
                "line, its paragraphs as {\"text\": [\"para 1\", \"para 2\"]} to join them "
                "with a blank line")
    return said


def _field_text(value, key: str, paragraphs: bool, where: str) -> str:
    """The text of `value`, found under `key`: a string, or with `paragraphs` a list of strings
    joined as lm_dataformat joins them."""
    if isinstance(value, str):
        return value
    if paragraphs and isinstance(value, list):
        bad = [i for i, p in enumerate(value) if not isinstance(p, str)]
        if not bad:
            return PARAGRAPH_JOINER.join(value)
        raise ValueError(f"{where}: {key!r} is a list of paragraphs whose item {bad[0]} is a "
                         f"JSON {json_type(value[bad[0]])}, not a string; fix the line or "
                         "remove it")
    shown = json.dumps(value)
    hint = (" (a list of paragraphs is joined only with the default --jsonl-keys text)"
            if isinstance(value, list) and all(isinstance(p, str) for p in value) else "")
    raise ValueError(f"{where}: {key!r} is {shown[:40]}{'...' if len(shown) > 40 else ''}, not "
                     f"a string{hint}; fix the line or remove it (it would be tokenized as that "
                     "value's text)")


def _jsonl_documents(path: str, keys: Sequence[str]) -> Iterator[dict[str, str]]:
    """{key: text} per line of the JSON-lines file `path`."""
    line_no = 0
    try:
        with open_text(path) as f:
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
        raise ValueError(f"{path} holds a JSON {json_type(items)}, not an array of documents")
    for number, item in enumerate(items):
        where = f"{path} item {number}"
        if not isinstance(item, str):
            yield _record_texts(item, keys, where)
        elif len(keys) == 1:
            yield {keys[0]: item}
        else:
            raise ValueError(f"{where} is a string, one field; ask for one --jsonl-keys key")
