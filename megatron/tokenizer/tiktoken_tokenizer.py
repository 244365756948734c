"""`TiktokenTokenizer`: an OpenAI tiktoken encoding (needs the optional `tiktoken` package)."""

from __future__ import annotations

from typing import Iterable

from megatron.tokenizer.abstract import AbstractTokenizer


def _import_tiktoken():
    try:
        import tiktoken
    except ImportError as err:
        raise ImportError("TiktokenTokenizer needs the tiktoken package: "
                          "pip install tiktoken") from err
    return tiktoken


class TiktokenTokenizer(AbstractTokenizer):
    """`vocab_file` names the encoding (e.g. "cl100k_base"); EOD and pad are its EOT token."""

    def __init__(self, vocab_file: str | None):
        super().__init__("TiktokenTokenizer")
        tiktoken = _import_tiktoken()
        if not vocab_file:
            raise ValueError("TiktokenTokenizer needs vocab_file set to an encoding name, "
                             "e.g. cl100k_base")
        try:
            self.tokenizer = tiktoken.get_encoding(vocab_file)
        except ValueError as err:
            raise ValueError(f"TiktokenTokenizer: unknown encoding {vocab_file!r}: {err}") from err

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.n_vocab

    @property
    def max_token_id(self) -> int:
        return self.tokenizer.max_token_value

    @property
    def eod(self) -> int:
        return self.tokenizer.eot_token

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, allowed_special="all")

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer.encode_batch(texts, allowed_special="all")

    def detokenize(self, token_ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in token_ids])
