"""preprocess_data.py with GPT-NeoX's command lines: .jsonl.zst / .json.zst inputs, --num-docs,
--ftfy, --dataset-impl, and the errors for corrupt files and missing optional packages."""

from __future__ import annotations

import json
import logging
import sys

import ftfy
import pytest
import zstandard

from megatron.data import preprocess as preprocess_module
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.preprocess import preprocess
from tests.data.test_preprocess import load_script

CLEAN = ["The first document.", "A second one, with café and 東京.", "",
         "def f(x):\n    return x  # code\n", "Last one."]
MOJIBAKE = ["The Mona Lisa doesnÃ¢â‚¬â„¢t have eyebrows.", "schÃ¶n", "plain"]


def jsonl_bytes(texts, key="text") -> bytes:
    return "".join(json.dumps({key: t}) + "\n" for t in texts).encode("utf-8")


def write_zst(path, data: bytes, frames: int = 1):
    """`data` compressed as `frames` zstd frames back to back (as pzstd writes them)."""
    cut = [len(data) * i // frames for i in range(frames + 1)]
    compressor = zstandard.ZstdCompressor()
    path.write_bytes(b"".join(compressor.compress(data[a:b]) for a, b in zip(cut, cut[1:])))
    return path


def tokens(prefix):
    ds = MMapIndexedDataset(str(prefix))
    return [ds[i].tolist() for i in range(len(ds))]


def same_files(a, b) -> bool:
    return all(open(f"{a}{ext}", "rb").read() == open(f"{b}{ext}", "rb").read()
               for ext in (".bin", ".idx"))


@pytest.fixture
def gpt2_files(tmp_path):
    """vocab.json + merges.txt of a small byte-level BPE, as GPT-2 ships its tokenizer."""
    from tokenizers import Tokenizer

    from megatron.tokenizer.train_bpe import train_bpe_tokenizer

    path = tmp_path / "tok" / "tokenizer.json"
    train_bpe_tokenizer([t * 5 for t in CLEAN] * 4, 300, str(path),
                        special_tokens=("<|endoftext|>",))
    Tokenizer.from_file(str(path)).model.save(str(tmp_path / "tok"))
    return str(tmp_path / "tok" / "vocab.json"), str(tmp_path / "tok" / "merges.txt")


def test_neox_readme_command_on_jsonl_zst_writes_the_bytes_of_the_plain_jsonl(tmp_path,
                                                                              gpt2_files):
    assert all(ftfy.fix_text(t) == t for t in CLEAN)  # nothing for --ftfy to change
    vocab, merges = gpt2_files
    (tmp_path / "plain.jsonl").write_bytes(jsonl_bytes(CLEAN))
    zst = write_zst(tmp_path / "mydataset.jsonl.zst", jsonl_bytes(CLEAN), frames=2)
    script = load_script("preprocess_data")
    # GPT-NeoX's README example (--vocab abbreviates --vocab-file), plus --num-docs and --ftfy
    assert script.main(["--input", str(zst), "--output-prefix", str(tmp_path / "mydataset"),
                        "--vocab", vocab, "--merge-file", merges, "--dataset-impl", "mmap",
                        "--tokenizer-type", "GPT2BPETokenizer", "--append-eod",
                        "--num-docs", str(len(CLEAN)), "--ftfy"]) == 0
    assert script.main(["--input", str(tmp_path / "plain.jsonl"), "--output-prefix",
                        str(tmp_path / "plain"), "--vocab-file", vocab, "--merge-file", merges,
                        "--tokenizer-type", "GPT2BPETokenizer", "--append-eod"]) == 0
    assert same_files(tmp_path / "mydataset_text_document", tmp_path / "plain_text_document")
    assert len(tokens(tmp_path / "plain_text_document")) == len(CLEAN) - 1  # the empty one


def test_json_zst_array_of_strings_is_one_document_per_string(tmp_path):
    array = write_zst(tmp_path / "a.json.zst", json.dumps(CLEAN).encode("utf-8"))
    (tmp_path / "a.jsonl").write_bytes(jsonl_bytes(CLEAN))
    for name in ("a.json.zst", "a.jsonl"):
        preprocess(str(tmp_path / name), str(tmp_path / name.replace(".", "_")),
                   "CharLevelTokenizer", append_eod=True)
    assert same_files(tmp_path / "a_json_zst_text_document", tmp_path / "a_jsonl_text_document")
    with pytest.raises(ValueError, match=f"{array} item 0 is a string, one field"):
        preprocess(str(array), str(tmp_path / "two"), "CharLevelTokenizer",
                   jsonl_keys=["text", "title"])


@pytest.mark.parametrize("workers", [1, 2])
def test_ftfy_tokenizes_the_text_ftfy_fixes(tmp_path, workers):
    fixed = [ftfy.fix_text(t) for t in MOJIBAKE]
    assert fixed[:2] == ["The Mona Lisa doesn't have eyebrows.", "schön"]
    write_zst(tmp_path / "m.jsonl.zst", jsonl_bytes(MOJIBAKE))
    script = load_script("preprocess_data")
    argv = ["--input", str(tmp_path / "m.jsonl.zst"), "--tokenizer-type", "CharLevelTokenizer",
            "--workers", str(workers)]
    assert script.main(argv + ["--output-prefix", str(tmp_path / "fixed"), "--ftfy"]) == 0
    assert script.main(argv + ["--output-prefix", str(tmp_path / "raw")]) == 0
    # CharLevelTokenizer: a token per UTF-8 byte
    assert tokens(tmp_path / "fixed_text_document") == [list(t.encode()) for t in fixed]
    assert tokens(tmp_path / "raw_text_document") == [list(t.encode()) for t in MOJIBAKE]


def test_num_docs_is_the_progress_total(tmp_path, monkeypatch, caplog):
    totals = []

    def spy(*args, **kwargs):
        totals.append(kwargs.get("total"))
        return real(*args, **kwargs)

    real = preprocess_module.progress
    monkeypatch.setattr(preprocess_module, "progress", spy)
    (tmp_path / "a.jsonl").write_bytes(jsonl_bytes(["a", "b", "c"]))
    with caplog.at_level(logging.INFO, logger="megatron"):
        preprocess(str(tmp_path / "a.jsonl"), str(tmp_path / "n"), "CharLevelTokenizer",
                   num_docs=3, log_interval=1)
        assert totals == [3] and "processed 3/3 documents" in caplog.text
        assert "--num-docs" not in caplog.text
        preprocess(str(tmp_path / "a.jsonl"), str(tmp_path / "m"), "CharLevelTokenizer",
                   num_docs=5)
    assert "read 3 documents, not the 5 that --num-docs gave" in caplog.text


def run_cli(script_name, argv, capsys, monkeypatch) -> str:
    """The `error:` lines of a run that must fail with status 1."""
    monkeypatch.setattr(logging.getLogger("megatron"), "handlers", [])
    assert load_script(script_name).main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return "\n".join(line for line in err.splitlines() if line.startswith("error"))


@pytest.mark.parametrize("content, message", [
    (b"this is not zstd", "is not valid zstd data (zstd decompressor error: Unknown frame "
                          "descriptor); write it again with zstd, or rename it without .zst if "
                          "it is not compressed"),
    (zstandard.ZstdCompressor().compress(jsonl_bytes(CLEAN * 50))[:-20],
     "ends before its zstd data does (the file is cut short, or empty); write it again"),
    (b"", "ends before its zstd data does (the file is cut short, or empty); write it again"),
], ids=["not-zstd", "cut-short", "empty"])
def test_a_corrupt_zst_names_the_file(tmp_path, capsys, monkeypatch, content, message):
    path = tmp_path / "bad.jsonl.zst"
    path.write_bytes(content)
    err = run_cli("preprocess_data", ["--input", str(path), "--output-prefix",
                                      str(tmp_path / "out"), "--tokenizer-type",
                                      "CharLevelTokenizer"], capsys, monkeypatch)
    assert err == f"error: {path} {message}"
    assert not list(tmp_path.glob("out*"))  # nothing half-written


@pytest.mark.parametrize("module, flag", [("zstandard", None), ("ftfy", "--ftfy")])
def test_a_missing_optional_package_is_named_with_its_install_command(tmp_path, capsys,
                                                                      monkeypatch, module, flag):
    write_zst(tmp_path / "a.jsonl.zst", jsonl_bytes(CLEAN))
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    argv = ["--input", str(tmp_path / "a.jsonl.zst"), "--output-prefix", str(tmp_path / "out"),
            "--tokenizer-type", "CharLevelTokenizer"] + ([flag] if flag else [])
    err = run_cli("preprocess_data", argv, capsys, monkeypatch)
    purpose = flag or f"reading {tmp_path / 'a.jsonl.zst'}"
    assert err == (f"error: {purpose} needs the {module} package, which is not installed: "
                   "pip install -r requirements/requirements-data.txt")
    assert not list(tmp_path.glob("out*"))


@pytest.mark.parametrize("argv, message", [
    (["--dataset-impl", "lazy"], "--dataset-impl lazy writes GPT-NeoX's older indexed format, "
                                 "which this project does not read; use --dataset-impl mmap"),
    (["--input", "{tmp}/x.jsonl.zst.tar"], "input {tmp}/x.jsonl.zst.tar: unsupported file type "
                                           "(an lm_dataformat archive: unpack it into .jsonl or "
                                           ".txt files first); use .jsonl, .jsonl.gz, "
                                           ".jsonl.zst, .json.zst, .txt, .txt.gz"),
], ids=["dataset-impl", "lm-dataformat-archive"])
def test_what_cannot_be_done_is_refused_by_name(tmp_path, capsys, monkeypatch, argv, message):
    (tmp_path / "a.jsonl").write_bytes(jsonl_bytes(CLEAN))
    (tmp_path / "x.jsonl.zst.tar").write_bytes(b"")
    base = ["--input", str(tmp_path / "a.jsonl"), "--output-prefix", str(tmp_path / "out"),
            "--tokenizer-type", "CharLevelTokenizer"]
    err = run_cli("preprocess_data", base + [a.format(tmp=tmp_path) for a in argv], capsys,
                  monkeypatch)
    assert err.startswith("error: " + message.format(tmp=tmp_path)), err


def test_mask_tool_ftfy_and_zst_input(tmp_path):
    texts = ["Q: schÃ¶n? A: yes", "Q: plain? A: no"]
    write_zst(tmp_path / "m.jsonl.zst", jsonl_bytes(texts))
    mask_after = ",".join(str(b) for b in b"A:")  # CharLevelTokenizer: ids are UTF-8 bytes
    assert load_script("preprocess_data_with_mask").main(
        ["--input", str(tmp_path / "m.jsonl.zst"), "--output-prefix", str(tmp_path / "sft"),
         "--tokenizer-type", "CharLevelTokenizer", "--mask-before-token", mask_after,
         "--ftfy"]) == 0
    assert tokens(tmp_path / "sft_text_document") == [list(ftfy.fix_text(t).encode())
                                                      for t in texts]
    labels = tokens(tmp_path / "sft_label_document")[0]
    assert labels[-4:] == list(b" yes") and labels[0] == -100


def test_tools_reading_jsonl_lines_refuse_a_json_array_by_name(tmp_path):
    from megatron.data.mask_preprocess import MaskRule, preprocess_masked
    from megatron.tokenizer import build_tokenizer

    path = write_zst(tmp_path / "p.json.zst", json.dumps([{"p": "a", "c": "b"}]).encode())
    with pytest.raises(ValueError, match=f"{path} holds one JSON array of documents, and this "
                                         "reads one JSON record per line"):
        preprocess_masked(str(path), str(tmp_path / "o"), build_tokenizer("CharLevelTokenizer"),
                          MaskRule(prompt_key="p", completion_key="c"))


def test_mask_tool_takes_gpt_neox_workers_and_log_interval(tmp_path, gpt2_files, caplog):
    """GPT-NeoX's mask command line with --workers 2 (and --ftfy, whose tokenizer is sent to
    the worker processes) writes the bytes of one process."""
    import logging

    vocab, merges = gpt2_files
    texts = [f"{t} <|endoftext|> answer {i}" for i, t in enumerate(CLEAN * 120)] + MOJIBAKE
    (tmp_path / "m.jsonl").write_bytes(jsonl_bytes(texts))
    eod = json.load(open(vocab))["<|endoftext|>"]
    base = ["--input", str(tmp_path / "m.jsonl"), "--tokenizer-type", "GPT2BPETokenizer",
            "--vocab-file", vocab, "--merge-file", merges, "--append-eod", "--ftfy",
            "--mask-before-token", str(eod)]
    script = load_script("preprocess_data_with_mask")
    assert script.main(base + ["--output-prefix", str(tmp_path / "one")]) == 0
    with caplog.at_level(logging.INFO, logger="megatron"):
        assert script.main(base + ["--output-prefix", str(tmp_path / "two"), "--workers", "2",
                                   "--log-interval", "300"]) == 0
    for kind in ("text", "label"):
        assert same_files(tmp_path / f"one_{kind}_document", tmp_path / f"two_{kind}_document")
    assert len(tokens(tmp_path / "two_text_document")) == len(texts)
    assert "processed 600 documents" in caplog.text
