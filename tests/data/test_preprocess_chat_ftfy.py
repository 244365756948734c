"""preprocess_data_with_chat_template.py --ftfy: each message's content is fixed with
ftfy.fix_text before the chat template renders it, so a file with mojibake writes the token and
label files of the same file with the text fixed beforehand."""

from __future__ import annotations

import json
import logging
import sys

import ftfy
import pytest

from megatron.data import chat_preprocess
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.entry import run_entry
from tests.data.test_preprocess import load_script
from tests.data.test_preprocess_neox_flags import same_files

MOJIBAKE = [[{"role": "system", "content": "answer briefly"},
             {"role": "user", "content": "The Mona Lisa doesnÃ¢â‚¬â„¢t have eyebrows?"},
             {"role": "assistant", "content": "schÃ¶n, cafÃ©!"}],
            [{"role": "user", "content": "plain?"}, {"role": "assistant", "content": "yes"}]]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from megatron.data.chat_example import make_chat_tokenizer
    from megatron.tokenizer.train_bpe import train_bpe_tokenizer

    out = tmp_path_factory.mktemp("chat_tok")
    train_bpe_tokenizer(["what is red? cherry! schön café doesn't"] * 20, 300,
                        str(out / "base.json"), special_tokens=("<|endoftext|>", "<|padding|>"))
    return str(make_chat_tokenizer(out / "base.json", out / "tok"))


def write_chats(path, conversations, fix=lambda text: text):
    with open(path, "w", encoding="utf-8") as f:
        for messages in conversations:
            fixed = [{**m, "content": fix(m["content"])} for m in messages]
            f.write(json.dumps({"messages": fixed, "reward": 1.0}, ensure_ascii=False) + "\n")
    return str(path)


def run(tok_dir, data, prefix, *flags) -> None:
    script = load_script("preprocess_data_with_chat_template")
    assert script.main(["--input", data, "--jsonl-keys", "messages", "--tokenizer-path",
                        tok_dir, "--output-prefix", str(prefix), *flags]) == 0


def test_ftfy_writes_what_the_pre_fixed_text_writes(tok_dir, tmp_path):
    from transformers import AutoTokenizer

    raw = write_chats(tmp_path / "raw.jsonl", MOJIBAKE)
    fixed = write_chats(tmp_path / "fixed.jsonl", MOJIBAKE, ftfy.fix_text)
    run(tok_dir, fixed, tmp_path / "fixed")
    run(tok_dir, raw, tmp_path / "raw")
    run(tok_dir, raw, tmp_path / "ftfy", "--ftfy")
    run(tok_dir, raw, tmp_path / "ftfy2", "--ftfy", "--workers", "2")  # fixed in the workers
    for kind in ("messages_document", "messages_label_document"):
        assert same_files(tmp_path / f"ftfy_{kind}", tmp_path / f"fixed_{kind}")
        assert same_files(tmp_path / f"ftfy2_{kind}", tmp_path / f"fixed_{kind}")
        assert not same_files(tmp_path / f"raw_{kind}", tmp_path / f"fixed_{kind}")
    tok = AutoTokenizer.from_pretrained(tok_dir)
    first = tok.decode(MMapIndexedDataset(str(tmp_path / "ftfy_messages_document"))[0])
    assert first == ("<|system|>answer briefly<|end|><|user|>The Mona Lisa doesn't have "
                     "eyebrows?<|end|><|assistant|>schön, café!<|end|><|endoftext|>")


def test_ftfy_fixes_only_the_text_of_messages():
    messages = [{"role": "user", "content": "cafÃ©"}, {"role": "x", "content": 3}]
    fixed = chat_preprocess.fixed_messages(messages, ftfy.fix_text)
    assert fixed == [{"role": "user", "content": "café"}, {"role": "x", "content": 3}]
    assert messages[0]["content"] == "cafÃ©"  # the record read is not changed
    assert chat_preprocess.fixed_messages("not a list", ftfy.fix_text) == "not a list"


def test_a_line_that_is_not_an_object_is_named(tok_dir, tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(write_chats(tmp_path / "ok.jsonl", MOJIBAKE[:1]) and
                    (tmp_path / "ok.jsonl").read_text() + '"conversation"\n')
    with pytest.raises(ValueError) as err:
        run(tok_dir, str(data), tmp_path / "out")
    assert str(err.value) == (f"{data} line 2 is a JSON string, not an object with the "
                              "conversation under messages")


def test_ftfy_without_the_package_is_refused_with_its_install_command(tok_dir, tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.setattr(logging.getLogger("megatron"), "handlers", [])
    monkeypatch.setitem(sys.modules, "ftfy", None)  # import fails as if not installed
    data = write_chats(tmp_path / "raw.jsonl", MOJIBAKE)
    script = load_script("preprocess_data_with_chat_template")
    argv = ["--input", data, "--jsonl-keys", "messages", "--tokenizer-path", tok_dir,
            "--output-prefix", str(tmp_path / "out"), "--ftfy"]
    assert run_entry(lambda: script.main(argv)) == 1
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error")] == [
        "error: --ftfy needs the ftfy package, which is not installed: "
        "pip install -r requirements/requirements-data.txt"], err
    assert not list(tmp_path.glob("out*"))  # refused before any output
