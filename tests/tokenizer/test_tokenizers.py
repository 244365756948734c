"""Tokenizer backends: round trips, special ids (A13), registry errors, optional packages."""

from __future__ import annotations

import sys

import pytest
from tokenizers import Tokenizer

from megatron.tokenizer import TOKENIZERS, build_tokenizer
from megatron.tokenizer.train_bpe import train_bpe_tokenizer

TEXTS = ["Hello, world!\n\tIndented line", "café 東京 🙂 naïve", "", "  two  spaces  "]


def test_hf_tokenizer_round_trip_and_special_ids(tiny_tokenizer_file):
    tok = build_tokenizer("HFTokenizer", tiny_tokenizer_file)
    assert tok.name == "HFTokenizer"
    assert (tok.eod, tok.pad) == (0, 1)
    assert tok.vocab_size == Tokenizer.from_file(tiny_tokenizer_file).get_vocab_size()
    assert tok.max_token_id == tok.vocab_size - 1
    for text in TEXTS:
        ids = tok.tokenize(text)
        assert all(isinstance(i, int) for i in ids)
        assert tok.detokenize(ids) == text
    assert tok.tokenize_batch(TEXTS) == [tok.tokenize(t) for t in TEXTS]
    assert len(tok.tokenize("the quick brown fox")) < len("the quick brown fox")


def test_registry_is_case_insensitive_and_lists_valid_names(tiny_tokenizer_file):
    assert build_tokenizer("hftokenizer", tiny_tokenizer_file).name == "HFTokenizer"
    with pytest.raises(ValueError) as err:
        build_tokenizer("WordPiece")
    assert "unknown tokenizer_type 'WordPiece'" in str(err.value)
    for name in TOKENIZERS:
        assert name in str(err.value)


def test_missing_and_unreadable_files_are_named(tmp_path):
    missing = str(tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError, match=f"tokenizer JSON file \\(vocab_file\\) {missing}"):
        build_tokenizer("HFTokenizer", missing)
    with pytest.raises(ValueError, match="needs a tokenizer JSON file"):
        build_tokenizer("HFTokenizer")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(ValueError, match=f"cannot load {garbage}"):
        build_tokenizer("HFTokenizer", str(garbage))


def test_tokenizer_without_eod_is_refused(tmp_path, corpus_texts):
    path = tmp_path / "no_eod.json"
    train_bpe_tokenizer(corpus_texts, 300, str(path), special_tokens=("<pad>",))
    with pytest.raises(ValueError) as err:
        build_tokenizer("HFTokenizer", str(path))
    assert "end-of-document token '<|endoftext|>'" in str(err.value)
    assert str(path) in str(err.value)


def test_pad_falls_back_to_eod(tmp_path, corpus_texts):
    path = tmp_path / "eod_only.json"
    train_bpe_tokenizer(corpus_texts, 300, str(path), special_tokens=("<|endoftext|>",))
    tok = build_tokenizer("HFTokenizer", str(path))
    assert tok.pad == tok.eod == 0


@pytest.fixture
def gpt2_json(tmp_path, corpus_texts):
    """A tokenizer JSON whose only special token is "<|endoftext|>", like GPT-2's."""
    path = tmp_path / "json" / "tokenizer.json"
    train_bpe_tokenizer(corpus_texts, 400, str(path), special_tokens=("<|endoftext|>",))
    return str(path)


@pytest.fixture
def gpt2_files(tmp_path, gpt2_json):
    """vocab.json + merges.txt of that tokenizer, as GPT-2 ships them."""
    Tokenizer.from_file(gpt2_json).model.save(str(tmp_path))
    return str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")


def test_gpt2_bpe_files_match_the_json_tokenizer(gpt2_files, gpt2_json):
    vocab, merges = gpt2_files
    hf = build_tokenizer("HFTokenizer", gpt2_json)
    gpt2 = build_tokenizer("GPT2BPETokenizer", vocab, merges)
    assert gpt2.eod == hf.eod and gpt2.pad == gpt2.eod and gpt2.vocab_size == 400
    for text in TEXTS:
        assert gpt2.tokenize(text) == hf.tokenize(text)
        assert gpt2.detokenize(gpt2.tokenize(text)) == text
    assert gpt2.tokenize("a<|endoftext|>b")[1] == gpt2.eod


def test_hf_gpt2_tokenizer_adds_a_padding_token(gpt2_files, tmp_path):
    vocab, merges = gpt2_files
    base = build_tokenizer("GPT2BPETokenizer", vocab, merges)
    tok = build_tokenizer("HFGPT2Tokenizer", str(tmp_path))  # a folder holding both files
    assert tok.pad == base.vocab_size and tok.vocab_size == base.vocab_size + 1
    assert tok.max_token_id == tok.pad


def test_gpt2_needs_both_files(gpt2_files, tmp_path):
    vocab, _ = gpt2_files
    with pytest.raises(ValueError, match="needs a merge file"):
        build_tokenizer("GPT2BPETokenizer", vocab)
    missing = str(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match=missing):
        build_tokenizer("GPT2BPETokenizer", vocab, missing)


def test_char_level_tokenizer():
    tok = build_tokenizer("CharLevelTokenizer")
    assert (tok.vocab_size, tok.eod, tok.pad, tok.max_token_id) == (512, 0, 1, 255)
    for text in TEXTS:
        ids = tok.tokenize(text)
        assert ids == list(text.encode("utf-8"))
        assert tok.detokenize(ids) == text
    assert [list(a) for a in tok.tokenize_batch(TEXTS)] == [tok.tokenize(t) for t in TEXTS]


@pytest.mark.parametrize("name, module, hint", [
    ("SPMTokenizer", "sentencepiece", "pip install sentencepiece"),
    ("TiktokenTokenizer", "tiktoken", "pip install tiktoken"),
])
def test_optional_backends_name_their_package(monkeypatch, name, module, hint):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ImportError, match=hint):
        build_tokenizer(name, "model")


def test_a_tokenizer_file_not_given_is_asked_for_by_its_key_and_the_tools_flag():
    with pytest.raises(ValueError, match=r"^HFTokenizer needs a tokenizer JSON file \(vocab_file\); "
                                         r"set vocab_file in the config \(--vocab-file for the "
                                         r"data tools\)$"):
        build_tokenizer("HFTokenizer", None)
    with pytest.raises(ValueError, match=r"GPT2BPETokenizer needs a merge file \(merges.txt\); set "
                                         r"merge_file in the config \(--merge-file"):
        build_tokenizer("GPT2BPETokenizer", __file__, None)
