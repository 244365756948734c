"""jsonl lines in lm_dataformat's shapes, which GPT-NeoX reads through it: with the default
--jsonl-keys text, a bare JSON string is the document and a list of strings under "text" its
paragraphs joined with a blank line; every other shape is refused naming the file and line."""

from __future__ import annotations

import json

import pytest

from megatron.data.preprocess import preprocess
from tests.data.test_preprocess import load_script
from tests.data.test_preprocess_neox_flags import run_cli, same_files, tokens, write_zst

LINES = ['"a bare string"', '{"text": ["para 1", "para 2", "para 3"]}', '{"text": "plain"}',
         '""', '{"text": []}', '{"text": ["", "after an empty paragraph"]}']
# what lm_dataformat 0.0.20's Reader(path).stream_data() yields for LINES; GPT-NeoX drops the
# empty ones, as preprocess does
YIELDED = ["a bare string", "para 1\n\npara 2\n\npara 3", "plain", "", "",
           "\n\nafter an empty paragraph"]


def test_lm_dataformat_lines_are_read_as_lm_dataformat_reads_them(tmp_path):
    data = "".join(line + "\n" for line in LINES).encode()
    (tmp_path / "lmd.jsonl").write_bytes(data)
    write_zst(tmp_path / "lmd.jsonl.zst", data)
    (tmp_path / "objects.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                    for t in YIELDED))
    script = load_script("preprocess_data")
    for name in ("lmd.jsonl", "lmd.jsonl.zst", "objects.jsonl"):
        assert script.main(["--input", str(tmp_path / name), "--output-prefix",
                            str(tmp_path / name.replace(".", "_")), "--tokenizer-type",
                            "CharLevelTokenizer", "--append-eod"]) == 0
    # CharLevelTokenizer: a token per UTF-8 byte; 0 ends a document
    assert tokens(tmp_path / "lmd_jsonl_text_document") == [list(t.encode()) + [0]
                                                            for t in YIELDED if t]
    for name in ("lmd_jsonl_zst", "objects_jsonl"):
        assert same_files(tmp_path / "lmd_jsonl_text_document",
                          tmp_path / f"{name}_text_document")


def test_a_json_zst_object_joins_its_paragraphs_as_a_jsonl_line_does(tmp_path):
    write_zst(tmp_path / "a.json.zst", json.dumps(["one", {"text": ["p1", "p2"]}]).encode())
    result = preprocess(str(tmp_path / "a.json.zst"), str(tmp_path / "a"), "CharLevelTokenizer")
    assert tokens(result.prefixes["text"]) == [list(b"one"), list(b"p1\n\np2")]


BARE_STRING = ("line 2 is a JSON string, not an object with the text under a key: a bare string "
               "is a document only with the default --jsonl-keys text (lm_dataformat's shape), "
               "not with --jsonl-keys ")


@pytest.mark.parametrize("line, keys, message", [
    ('["para 1", "para 2"]', ["text"],
     "line 2 is a JSON array, not an object with the text under a key (lm_dataformat refuses "
     "an array line too): write one document per line, its paragraphs as {\"text\": "
     "[\"para 1\", \"para 2\"]} to join them with a blank line"),
    ("42", ["text"], "line 2 is a JSON number, not an object with the text under a key"),
    ("null", ["text"], "line 2 is a JSON null, not an object with the text under a key"),
    ('{"body": "x"}', ["text"], "line 2 has no key 'text' (it has: body); set --jsonl-keys"),
    ('{"text": ["a", 1]}', ["text"],
     "line 2: 'text' is a list of paragraphs whose item 1 is a JSON number, not a string; fix "
     "the line or remove it"),
    ('{"text": {"a": "b"}}', ["text"], "line 2: 'text' is {\"a\": \"b\"}, not a string"),
    ('"a bare string"', ["title"], BARE_STRING + "title"),
    ('"a bare string"', ["text", "title"], BARE_STRING + "text title"),
    ('{"text": "x", "title": ["p1", "p2"]}', ["text", "title"],
     "line 2: 'title' is [\"p1\", \"p2\"], not a string (a list of paragraphs is joined only "
     "with the default --jsonl-keys text); fix the line"),
], ids=["array-line", "number", "null", "no-key", "non-string-paragraph", "object-value",
        "string-other-key", "string-two-keys", "paragraphs-other-keys"])
def test_other_shapes_are_refused_naming_file_and_line(tmp_path, capsys, monkeypatch, line,
                                                       keys, message):
    first = json.dumps({k: "fine" for k in keys})
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{first}\n{line}\n")
    err = run_cli("preprocess_data", ["--input", str(path), "--output-prefix",
                                      str(tmp_path / "out"), "--tokenizer-type",
                                      "CharLevelTokenizer", "--jsonl-keys", *keys],
                  capsys, monkeypatch)
    assert err.startswith(f"error: {path} {message}"), err
    assert not list(tmp_path.glob("out*"))  # nothing half-written
