"""`HFTokenizer`: a HuggingFace `tokenizers` JSON file (EOD "<|endoftext|>", pad "<|padding|>")."""

from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer

from megatron.tokenizer.abstract import AbstractTokenizer, require_file, require_token_id

EOD_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|padding|>"


class TokenizersBackend(AbstractTokenizer):
    """Shared code for tokenizers built on a `tokenizers.Tokenizer`."""

    def __init__(self, name: str, tokenizer: Tokenizer, source: str):
        super().__init__(name)
        self.tokenizer = tokenizer
        self.source = source
        self._eod = require_token_id(tokenizer.token_to_id, EOD_TOKEN, "end-of-document", source)
        pad = tokenizer.token_to_id(PAD_TOKEN)
        self._pad = self._eod if pad is None else int(pad)
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._max_token_id = max(vocab.values())

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_token_id(self) -> int:
        return self._max_token_id

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def pad(self) -> int:
        return self._pad

    @property
    def vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab(with_added_tokens=True)

    @property
    def inv_vocab(self) -> dict[int, str]:
        return {i: t for t, i in self.vocab.items()}

    def tokenize(self, text: str) -> list[int]:
        """Ids of `text`, with the file's post-processor applied (e.g. a BOS), as GPT-NeoX."""
        return self.tokenizer.encode(text).ids

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        encodings = self.tokenizer.encode_batch(texts)
        return [e.ids for e in encodings]

    def detokenize(self, token_ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in token_ids], skip_special_tokens=False)


class HFTokenizer(TokenizersBackend):
    """A `tokenizer.json` written by `tokenizers` (e.g. by `train_bpe_tokenizer`)."""

    def __init__(self, vocab_file: str | None):
        path = require_file(vocab_file, "tokenizer JSON file (vocab_file)", "HFTokenizer")
        try:
            tokenizer = Tokenizer.from_file(path)
        except Exception as err:  # tokenizers raises its own Exception subclass
            raise ValueError(f"HFTokenizer: cannot load {path} as a tokenizers JSON file: "
                             f"{err}") from err
        super().__init__("HFTokenizer", tokenizer, path)
