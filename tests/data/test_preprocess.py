"""preprocess: inputs of every kind, token contents, workers, errors, and the CLI."""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import os

import numpy as np
import pytest

from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data import preprocess as preprocess_module
from megatron.data.preprocess import expand_inputs, preprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_jsonl(path, records, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


@pytest.fixture
def inputs(tmp_path):
    folder = tmp_path / "in"
    (folder / "nested").mkdir(parents=True)
    write_jsonl(folder / "a.jsonl", [{"text": "hello", "title": "A"}, {"text": "", "title": "B"},
                                     {"text": "wörld", "title": "C"}])
    write_jsonl(folder / "nested" / "b.jsonl.gz", [{"text": "zipped", "title": "D"}], gz=True)
    (folder / "c.txt").write_text("plain\nfile", encoding="utf-8")
    (folder / "README.md").write_text("not data")
    return folder


def read_all(prefix):
    ds = MMapIndexedDataset(prefix)
    return [ds[i].tolist() for i in range(len(ds))], ds


def test_directory_of_mixed_inputs(inputs, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="megatron"):
        files = expand_inputs(str(inputs))
    assert (f"input directory {inputs}: 1 file(s) that are not data are skipped: "
            f"{inputs / 'README.md'}") in caplog.text
    assert [os.path.relpath(f, inputs) for f in files] == ["a.jsonl", "c.txt", "nested/b.jsonl.gz"]
    result = preprocess(str(inputs), str(tmp_path / "out" / "d"), "CharLevelTokenizer",
                        append_eod=True)
    assert result.prefixes == {"text": str(tmp_path / "out" / "d_text_document")}
    items, ds = read_all(result.prefixes["text"])
    expected = [list(t.encode()) + [0] for t in ["hello", "wörld", "plain\nfile", "zipped"]]
    assert items == expected and ds.dtype == np.uint16
    assert ds.doc_idx.tolist() == [0, 1, 2, 3, 4]
    assert result.skipped_empty == {"text": 1} and result.tokens == sum(map(len, expected))


def test_several_keys_comma_list_and_no_eod(inputs, tmp_path):
    listed = f"{inputs / 'a.jsonl'},{inputs / 'nested' / 'b.jsonl.gz'}"
    result = preprocess(listed, str(tmp_path / "k"), "CharLevelTokenizer",
                        jsonl_keys=["text", "title"])
    assert read_all(result.prefixes["title"])[0] == [[65], [66], [67], [68]]
    assert read_all(result.prefixes["text"])[0] == [list(b"hello"), list("wörld".encode()),
                                                    list(b"zipped")]


def test_workers_write_the_same_bytes(tmp_path, monkeypatch):
    from megatron.tokenizer.train_bpe import train_bpe_tokenizer

    records = [{"text": "" if i % 50 == 7 else f"document number {i} " * (i % 7 + 1)}
               for i in range(300)]
    write_jsonl(tmp_path / "many.jsonl", records)
    tok = train_bpe_tokenizer([r["text"] for r in records], 300, str(tmp_path / "tok.json"))
    monkeypatch.setattr(preprocess_module, "BATCH_DOCS", 16)  # many batches, in order
    one, two = (preprocess(str(tmp_path / "many.jsonl"), str(tmp_path / name), "HFTokenizer",
                           str(tmp_path / "tok.json"), append_eod=True, workers=workers)
                for name, workers in (("one", 1), ("two", 2)))
    for ext in (".bin", ".idx"):
        with open(one.prefixes["text"] + ext, "rb") as a, open(two.prefixes["text"] + ext,
                                                               "rb") as b:
            assert a.read() == b.read()
    eod = tok.token_to_id("<|endoftext|>")
    expected = [tok.encode(r["text"]).ids + [eod] for r in records if r["text"]]
    assert read_all(two.prefixes["text"])[0] == expected
    assert two.skipped_empty == {"text": 6} and two.documents == 300


def test_tokenizers_threads_are_off_while_preprocessing(tmp_path, monkeypatch):
    from megatron.tokenizer.char_level import CharLevelTokenizer

    seen = []

    class Spy(CharLevelTokenizer):
        def tokenize_batch(self, texts):
            seen.append(os.environ.get("TOKENIZERS_PARALLELISM"))
            return super().tokenize_batch(texts)

    write_jsonl(tmp_path / "x.jsonl", [{"text": "abc"}])
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    preprocess(str(tmp_path / "x.jsonl"), str(tmp_path / "x"), tokenizer=Spy())
    assert seen == ["false"] and os.environ["TOKENIZERS_PARALLELISM"] == "true"


def test_progress_reports_rates(tmp_path, caplog, monkeypatch):
    write_jsonl(tmp_path / "x.jsonl", [{"text": "abc"}] * 200)
    monkeypatch.setattr(preprocess_module, "BATCH_DOCS", 50)
    with caplog.at_level(logging.INFO, logger="megatron"):
        preprocess(str(tmp_path / "x.jsonl"), str(tmp_path / "x"), "CharLevelTokenizer",
                   log_interval=64)
    assert "processed 100 documents" in caplog.text  # the first batch end past 64
    assert "docs/s" in caplog.text and "tokens/s" in caplog.text and "MB/s" in caplog.text
    assert "done: 200 documents, 600 tokens" in caplog.text


@pytest.mark.parametrize("content, pattern", [
    ('{"text": "a"}\n{"body": "b"}\n', r"line 2 has no key 'text' \(it has: body\)"),
    ('{"text": "a"}\nnot json\n', "line 2 is not valid JSON"),
    ('{"text": "a"}\n{"text": null}\n', "line 2: 'text' is null, not a string"),
    ('{"text": 5}\n', "line 1: 'text' is 5, not a string"),
    ('["text"]\n', "line 1 is a JSON array, not an object"),
    (b'{"text": "a"}\n{"text": "\xd2\xff"}\n', r"bad.jsonl is not UTF-8 text \(invalid continuation byte at or after line "),
    (b"garbage", r"is not a gzip file \(Not a gzipped file"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, content, pattern):
    path = tmp_path / ("bad.jsonl.gz" if content == b"garbage" else "bad.jsonl")
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ValueError, match=pattern) as err:
        preprocess(str(path), str(tmp_path / "bad"), "CharLevelTokenizer")
    assert str(path) in str(err.value)
    assert not [p for p in os.listdir(tmp_path) if p.startswith("bad_")]  # nothing half-written


def test_an_input_without_documents_is_written_with_a_warning(tmp_path, caplog):
    (tmp_path / "empty.jsonl").write_text("\n")
    with caplog.at_level(logging.WARNING):
        result = preprocess(str(tmp_path / "empty.jsonl"), str(tmp_path / "e"),
                            "CharLevelTokenizer")
    assert result.documents == 0
    assert f"no documents in {tmp_path / 'empty.jsonl'}: the output" in caplog.text


def test_missing_and_unsupported_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="input .*nope.jsonl does not exist"):
        expand_inputs(str(tmp_path / "nope.jsonl"))
    (tmp_path / "x.csv").write_text("x")
    with pytest.raises(ValueError, match="unsupported file type"):
        expand_inputs(str(tmp_path / "x.csv"))


@pytest.mark.parametrize("name", ["part.zip", "part.tar.gz", "part.gz", "part.json",
                                  "part.csv"])
def test_a_directory_holding_data_of_another_kind_is_refused(inputs, name):
    """GPT-NeoX's lm_dataformat reads these in a folder: skipped, their documents would be lost."""
    (inputs / "nested" / name).write_bytes(b"x")
    with pytest.raises(ValueError) as err:
        expand_inputs(str(inputs))
    assert str(err.value) == (
        f"input directory {inputs} holds 1 file(s) of a kind this tool does not read "
        f"({inputs / 'nested' / name}), whose documents GPT-NeoX's lm_dataformat would take; "
        "convert them into .jsonl or .txt files (lm_dataformat archives: unpack them), or move "
        "them out of the folder")


def load_script(name):
    path = os.path.join(REPO, "tools", "datasets", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"tools_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_preprocess_script(inputs, tmp_path, capsys):
    script = load_script("preprocess_data")
    script.main(["--input", str(inputs / "a.jsonl"), "--output-prefix", str(tmp_path / "cli"),
                 "--tokenizer-type", "CharLevelTokenizer", "--append-eod", "--workers", "1",
                 "--log-interval", "1"])
    assert read_all(str(tmp_path / "cli_text_document"))[0][0] == list(b"hello") + [0]
    assert "cli_text_document" in capsys.readouterr().out


def test_the_script_says_what_each_key_s_file_holds(inputs, tmp_path, capsys):
    """One line per key with that file's documents and tokens: a.jsonl's empty text is
    skipped from the text file only."""
    script = load_script("preprocess_data")
    assert script.main(["--input", str(inputs / "a.jsonl"), "--output-prefix",
                        str(tmp_path / "k"), "--tokenizer-type", "CharLevelTokenizer",
                        "--jsonl-keys", "text", "title", "--workers", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"text: {tmp_path}/k_text_document  (2 documents, 11 tokens, 1 empty skipped, uint16)",
        f"title: {tmp_path}/k_title_document  (3 documents, 3 tokens, uint16)"]


@pytest.mark.parametrize("argv,message", [
    (["--input", "{tmp}/nope.jsonl", "--output-prefix", "{tmp}/out"],
     "error: input {tmp}/nope.jsonl does not exist"),
    (["--input", "{inputs}/a.jsonl", "--output-prefix", "{tmp}/file/out"],
     "error: --output-prefix: {tmp}/file is a file, not a directory; choose another path"),
    (["--input", "{inputs}/a.jsonl", "--output-prefix", "/proc/neox-test/out"],
     "error: --output-prefix: cannot create the directory /proc/neox-test (No such file or "
     "directory); choose a directory this user can write to"),
], ids=["missing-input", "prefix-under-a-file", "uncreatable-directory"])
def test_preprocess_script_ends_a_user_error_with_one_line(inputs, tmp_path, capsys, monkeypatch,
                                                           argv, message):
    # entry scripts install a log handler on the stderr of their time: give this call its own
    monkeypatch.setattr(logging.getLogger("megatron"), "handlers", [])
    (tmp_path / "file").write_text("x")
    script = load_script("preprocess_data")
    values = [a.format(tmp=tmp_path, inputs=inputs) for a in argv]
    assert script.main([*values, "--tokenizer-type", "CharLevelTokenizer"]) == 1
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error")] == \
        [message.format(tmp=tmp_path)], err
    assert "Traceback" not in err and not list(tmp_path.glob("out*"))


def test_prepare_script_names_the_data_dir_it_cannot_create(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(logging.getLogger("megatron"), "handlers", [])
    (tmp_path / "file").write_text("x")
    script = load_script("prepare_data")
    assert script.main(["builtin", "-d", str(tmp_path / "file")]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (f"error: --data-dir: cannot create the directory {tmp_path}/"
                                    "file/builtin (Not a directory); choose a directory this "
                                    "user can write to")
