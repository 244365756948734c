"""A tiny byte-level BPE trained once per session on a few KB of text."""

from __future__ import annotations

import pytest

SAMPLE_TEXT = """\
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Language models predict the next token from the tokens before it; training minimises the
cross-entropy of those predictions over a large corpus of documents.
def tokenize(text):
    return [ord(c) for c in text]  # tabs,\tnewlines and unicode: café, naïve, 東京, 🙂
"""


@pytest.fixture(scope="session")
def corpus_texts():
    return [SAMPLE_TEXT * 3, SAMPLE_TEXT.upper(), SAMPLE_TEXT[::-1]] * 4


@pytest.fixture(scope="session")
def tiny_tokenizer_file(tmp_path_factory, corpus_texts):
    from megatron.tokenizer.train_bpe import train_bpe_tokenizer

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe_tokenizer(corpus_texts, vocab_size=400, output_path=str(path))
    return str(path)
