"""prepare_data recipes: the built-in dataset end to end, reuse, rebuild; enwik8 offline."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import zipfile

import numpy as np
import pytest

from megatron.data import builtin_corpus
from megatron.data.indexed_dataset import MMapIndexedDataset, data_file_path
from megatron.data.prepare import prepare_builtin, prepare_enwik8, split_enwik8_pages
from megatron.tokenizer import build_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_script(argv):
    path = os.path.join(REPO, "tools", "datasets", "prepare_data.py")
    spec = importlib.util.spec_from_file_location("tools_prepare_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(argv)


def test_builtin_end_to_end(tmp_path, capsys):
    run_script(["builtin", "-d", str(tmp_path)])
    out = tmp_path / "builtin"
    assert sorted(os.listdir(out)) == ["builtin.jsonl", "builtin_text_document.bin",
                                       "builtin_text_document.idx", "manifest.json",
                                       "tokenizer.json"]
    assert f"data_path: {out / 'builtin_text_document'}" in capsys.readouterr().out
    tok = build_tokenizer("HFTokenizer", str(out / "tokenizer.json"))
    assert tok.vocab_size == 8192 and tok.eod == 0
    with open(out / "builtin.jsonl", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    assert len(texts) > 1500 and os.path.getsize(out / "builtin.jsonl") > 1_200_000
    ds = MMapIndexedDataset(str(out / "builtin_text_document"))
    assert len(ds) == len(texts) and ds.dtype == np.uint16
    for i in range(0, len(texts), 97):  # every document is its text followed by EOD
        ids = ds[i].tolist()
        assert ids[-1] == tok.eod and tok.detokenize(ids[:-1]) == texts[i]


def test_builtin_reuses_finished_steps_and_rebuilds_broken_ones(tmp_path, caplog):
    kw = dict(vocab_size=512, max_documents=120)
    first = prepare_builtin(str(tmp_path), **kw)
    paths = [first.corpus, first.vocab_file, data_file_path(first.data_prefix)]
    mtimes = [os.stat(p).st_mtime_ns for p in paths]
    again = prepare_builtin(str(tmp_path), **kw)
    assert again == first and [os.stat(p).st_mtime_ns for p in paths] == mtimes

    with open(data_file_path(first.data_prefix), "ab") as f:  # a damaged token file
        f.write(b"\x00")
    prepare_builtin(str(tmp_path), **kw)
    assert "rebuilding" in caplog.text and "longer than its index" in caplog.text
    MMapIndexedDataset(first.data_prefix)

    prepare_builtin(str(tmp_path), vocab_size=600, max_documents=120)  # new settings
    assert build_tokenizer("HFTokenizer", first.vocab_file).vocab_size == 600

    before = os.stat(first.corpus).st_mtime_ns
    prepare_builtin(str(tmp_path), vocab_size=600, max_documents=120, force=True)
    assert os.stat(first.corpus).st_mtime_ns != before


def test_corpus_is_deterministic_and_clean():
    docs = list(builtin_corpus.iter_documents())
    assert docs == list(builtin_corpus.iter_documents())
    assert len(set(docs)) == len(docs)
    assert min(len(d) for d in docs) >= builtin_corpus.MIN_DOC_CHARS
    assert list(builtin_corpus.STDLIB_MODULES) == sorted(builtin_corpus.STDLIB_MODULES)
    for unsafe in ("antigravity", "this", "idlelib", "tkinter", "turtledemo"):
        assert unsafe not in builtin_corpus.STDLIB_MODULES


def test_the_corpus_does_not_change_with_what_the_caller_imported(monkeypatch):
    """A library that adds a method to a standard-library class (transformers gives
    logging.Logger `info_once` and `warning_advice`) changes the docstrings this process sees;
    the corpus is read in a fresh interpreter, so the documents stay the same."""
    import logging

    clean = list(builtin_corpus.iter_documents())

    def info_once(self, msg):
        """Log `msg` once per process: a method a library attached to the class."""

    monkeypatch.setattr(logging.Logger, "info_once", info_once, raising=False)
    here = builtin_corpus.documents_of_this_process()
    assert any("a method a library attached" in d for d in here)
    assert list(builtin_corpus.iter_documents()) == clean


def test_modules_that_fail_to_import_are_named_in_the_callers_log(tmp_path, monkeypatch, caplog):
    """The corpus is read in another interpreter; the line naming the standard-library modules
    it had to leave out still reaches the caller's log, and the rest of the corpus is built."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "tabnanny.py").write_text("raise ImportError('broken on purpose')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow))
    with caplog.at_level(logging.INFO, logger="megatron"):
        documents = list(builtin_corpus.iter_documents())
    lines = [r.getMessage() for r in caplog.records if "skipped modules" in r.getMessage()]
    assert lines == ["built-in corpus: skipped modules that failed to import: tabnanny"]
    assert len(documents) > 100 and not any(d.startswith("tabnanny") for d in documents)


def test_enwik8_split_into_pages():
    raw = b"<mediawiki><siteinfo>x</siteinfo>\n  <page>one</page>\n  <page>two</page>\n"
    assert split_enwik8_pages(raw) == ["<mediawiki><siteinfo>x</siteinfo>\n  ",
                                       "<page>one</page>\n  ", "<page>two</page>\n"]


def test_enwik8_recipe_offline(tmp_path):
    raw = "<mediawiki>\n" + "".join(f"<page>article {i} ü</page>\n" for i in range(20))
    archive = tmp_path / "source.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("enwik8", raw.encode("utf-8"))
    result = prepare_enwik8(str(tmp_path / "data"), url=archive.as_uri())
    ds = MMapIndexedDataset(result.data_prefix)
    assert len(ds) == 21 and result.tokenizer_type == "CharLevelTokenizer"
    assert bytes(ds[3].tolist()[:-1]).decode() == "<page>article 2 ü</page>\n"
    with pytest.raises(RuntimeError, match="cannot download"):
        prepare_enwik8(str(tmp_path / "other"), url=(tmp_path / "missing.zip").as_uri())
