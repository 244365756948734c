"""The built-in English corpus: Python's own documentation, so no download is ever needed.

Every CPython install ships `pydoc_data/topics.py` (the language reference topics `help()`
shows) and docstrings for its standard library. The corpus is, in this order: each topic (sorted
by key), then for each module of `STDLIB_MODULES` (a fixed, sorted list) its docstring and the
docstrings of its public classes, their methods, and its public functions, sorted by name.
Identical docstrings appear once; docstrings shorter than `MIN_DOC_CHARS` are merged with their
neighbours from the same module, and a short remainder at a module's end is dropped. Modules
that fail to import are skipped. The result is deterministic for a given Python version
(about 1.6 MB, 2,300 documents, on CPython 3.11): the documents are read in a fresh
interpreter, since what a process has imported can change the standard library's objects
(transformers adds methods to `logging.Logger`, for one).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Iterator

from megatron.monitoring.logger import get_logger

logger = get_logger(__name__)

MIN_DOC_CHARS = 200

# Imported in this order. Left out on purpose: modules with import-time side effects
# (antigravity, this, idlelib, tkinter, turtle, turtledemo, rlcompleter), platform-only ones,
# and ones deprecated for removal (asynchat, cgi, distutils, imp, lib2to3, ...).
STDLIB_MODULES: tuple[str, ...] = tuple(sorted("""
abc argparse array ast asyncio asyncio.base_events asyncio.events asyncio.futures asyncio.locks
asyncio.queues asyncio.streams asyncio.subprocess asyncio.tasks atexit base64 bdb binascii bisect
builtins bz2 cProfile calendar cmath cmd code codecs codeop collections collections.abc colorsys
compileall concurrent.futures configparser contextlib contextvars copy copyreg csv ctypes
dataclasses datetime dbm decimal difflib dis doctest email email.charset email.header
email.headerregistry email.message email.parser email.policy email.utils encodings enum errno
faulthandler filecmp fileinput fnmatch fractions ftplib functools gc getopt getpass gettext glob
graphlib gzip hashlib heapq hmac html html.parser http http.client http.cookiejar http.cookies
http.server imaplib importlib importlib.abc importlib.machinery importlib.metadata
importlib.resources importlib.util inspect io ipaddress itertools json json.decoder json.encoder
keyword linecache locale logging logging.config logging.handlers lzma mailbox marshal math
mimetypes mmap modulefinder multiprocessing multiprocessing.managers multiprocessing.pool
multiprocessing.process multiprocessing.queues multiprocessing.shared_memory
multiprocessing.synchronize netrc numbers opcode operator optparse os pathlib pdb pickle
pickletools pkgutil platform plistlib poplib posixpath pprint profile pstats py_compile pyclbr
pydoc queue quopri random re reprlib runpy sched secrets select selectors shelve shlex shutil
signal smtplib socket socketserver sqlite3 ssl stat statistics string stringprep struct
subprocess symtable sys sysconfig tabnanny tarfile tempfile textwrap threading time timeit token
tokenize tomllib trace traceback tracemalloc types typing unicodedata unittest unittest.case
unittest.loader unittest.mock unittest.result unittest.runner unittest.suite urllib.error
urllib.parse urllib.request urllib.robotparser uuid warnings wave weakref webbrowser wsgiref
wsgiref.handlers wsgiref.headers wsgiref.simple_server wsgiref.util wsgiref.validate
xml.dom.minidom xml.etree.ElementTree xml.sax xml.sax.handler xml.sax.saxutils xmlrpc.client
xmlrpc.server zipapp zipfile zipimport zlib zoneinfo
""".split()))


def topic_documents() -> list[str]:
    """The language reference topics of `pydoc_data.topics`, sorted by key."""
    from pydoc_data.topics import topics

    return [topics[key].strip() for key in sorted(topics) if topics[key].strip()]


def _own_doc(obj) -> str | None:
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    return inspect.cleandoc(doc)


def _module_docstrings(module) -> Iterator[tuple[str, str]]:
    """(qualified name, docstring) for the module, its public classes/methods and functions."""
    name = module.__name__
    if (doc := _own_doc(module)) is not None:
        yield name, doc
    for attr in sorted(vars(module)):
        obj = vars(module)[attr]
        if attr.startswith("_") or getattr(obj, "__module__", None) != name:
            continue
        if inspect.isclass(obj):
            if (doc := _own_doc(obj)) is not None:
                yield f"{name}.{attr}", doc
            for meth in sorted(vars(obj)):
                member = vars(obj)[meth]
                if meth.startswith("_") or not callable(member):
                    continue
                if (doc := _own_doc(member)) is not None:
                    yield f"{name}.{attr}.{meth}", doc
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            if (doc := _own_doc(obj)) is not None:
                yield f"{name}.{attr}", doc


def _import(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except Exception:  # noqa: BLE001 - any failing module is simply left out
            return None


def docstring_documents(modules: tuple[str, ...] = STDLIB_MODULES,
                        skipped: list[str] | None = None) -> list[str]:
    """Documents from the docstrings of `modules`, short ones merged, duplicates dropped.
    The names of modules that fail to import are appended to `skipped`."""
    seen: set[str] = set()
    documents: list[str] = []
    skipped = [] if skipped is None else skipped
    for module_name in modules:
        module = _import(module_name)
        if module is None:
            skipped.append(module_name)
            continue
        pending: list[str] = []
        with warnings.catch_warnings():  # touching deprecated attributes (typing.io) warns
            warnings.simplefilter("ignore")
            entries = list(_module_docstrings(module))
        for qualname, doc in entries:
            key = hashlib.sha1(doc.encode()).hexdigest()
            if key in seen:
                continue
            seen.add(key)
            pending.append(f"{qualname}\n\n{doc}")
            if sum(len(p) for p in pending) >= MIN_DOC_CHARS:
                documents.append("\n\n".join(pending))
                pending = []
    return documents


def documents_of_this_process(skipped: list[str] | None = None) -> list[str]:
    """The corpus as the standard library's objects in this process give it; modules that
    fail to import are appended to `skipped`."""
    seen: set[str] = set()
    documents = []
    for doc in topic_documents() + docstring_documents(skipped=skipped):
        if doc not in seen:
            seen.add(doc)
            documents.append(doc)
    return documents


def iter_documents() -> Iterator[str]:
    """Every document of the corpus, in order, read in a fresh interpreter that imports only
    this module: the same whatever the calling process has imported."""
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    code = ("import json, sys; from megatron.data.builtin_corpus import "
            "documents_of_this_process as d; s = []; docs = d(s); "
            "json.dump({'documents': docs, 'skipped': s}, sys.stdout)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path})
    if proc.returncode != 0:
        raise RuntimeError(f"building the built-in corpus failed in {sys.executable}: "
                           f"{proc.stderr.strip()[-2000:]}")
    result = json.loads(proc.stdout)
    if result["skipped"]:
        logger.info("built-in corpus: skipped modules that failed to import: %s",
                    ", ".join(result["skipped"]))
    yield from result["documents"]


def write_corpus(path: str) -> dict:
    """Write the corpus as jsonl (`{"text": ...}` per line) atomically; returns counts."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    documents = chars = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for doc in iter_documents():
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
            documents += 1
            chars += len(doc)
    os.replace(tmp, path)
    logger.info("built-in corpus: %d documents, %d characters -> %s", documents, chars, path)
    return {"documents": documents, "characters": chars}
