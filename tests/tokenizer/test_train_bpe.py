"""train_bpe_tokenizer: special ids, size, file input, determinism."""

from __future__ import annotations

import pytest

from megatron.tokenizer import build_tokenizer
from megatron.tokenizer.train_bpe import train_bpe_tokenizer


def test_trained_json_loads_as_hf_tokenizer(tmp_path, corpus_texts):
    out = tmp_path / "sub" / "tok.json"
    trained = train_bpe_tokenizer(corpus_texts, 350, str(out))
    assert trained.get_vocab_size() == 350
    tok = build_tokenizer("HFTokenizer", str(out))
    assert tok.tokenize("<|endoftext|>") == [0] and tok.tokenize("<|padding|>") == [1]
    text = "any bytes round-trip: \x00\x7f ÿ 𝄞"
    assert tok.detokenize(tok.tokenize(text)) == text
    assert [p.name for p in out.parent.iterdir()] == ["tok.json"]  # no temporary file left


def test_training_from_files_is_deterministic(tmp_path, corpus_texts):
    files = []
    for i, text in enumerate(corpus_texts):
        path = tmp_path / f"part{i}.txt"
        path.write_text(text, encoding="utf-8")
        files.append(str(path))
    a = train_bpe_tokenizer(files, 320, str(tmp_path / "a.json"))
    b = train_bpe_tokenizer(files, 320, str(tmp_path / "b.json"))
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert a.get_vocab_size() == 320


def test_vocab_must_cover_the_bytes(tmp_path, corpus_texts):
    with pytest.raises(ValueError, match="below the 256 byte symbols plus 2 special tokens"):
        train_bpe_tokenizer(corpus_texts, 200, str(tmp_path / "x.json"))
