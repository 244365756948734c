"""`CharLevelTokenizer`: UTF-8 bytes as ids 0..255 in a 512-entry vocabulary, as in GPT-NeoX."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from megatron.tokenizer.abstract import AbstractTokenizer


class CharLevelTokenizer(AbstractTokenizer):
    """Each UTF-8 byte is its own id. EOD is 0 and pad is 1 (the bytes NUL and SOH, as in
    GPT-NeoX); ids above 255 never come out of `tokenize` and are dropped by `detokenize`."""

    def __init__(self, vocab_size: int = 512):
        super().__init__("CharLevelTokenizer")
        if vocab_size < 256:
            raise ValueError(f"CharLevelTokenizer needs vocab_size >= 256, got {vocab_size}")
        self._vocab_size = vocab_size

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_token_id(self) -> int:
        return 255

    @property
    def eod(self) -> int:
        return 0

    @property
    def pad(self) -> int:
        return 1

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def tokenize_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def detokenize(self, token_ids: Iterable[int]) -> str:
        data = bytes(int(i) for i in token_ids if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")
