"""`AbstractTokenizer`: the interface every tokenizer backend implements."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Callable, Iterable, Sequence


class AbstractTokenizer(ABC):
    """Text <-> token ids, plus the special ids training needs.

    `vocab_size` is the tokenizer's real size (the model pads it separately); `max_token_id` is
    the largest id `tokenize` can return, which decides the token file's dtype (A12).
    """

    def __init__(self, name: str):
        self.name = name

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids the tokenizer defines."""

    @property
    @abstractmethod
    def max_token_id(self) -> int:
        """Largest id `tokenize` can return."""

    @property
    @abstractmethod
    def eod(self) -> int:
        """End-of-document id, appended after each document."""

    @property
    def pad(self) -> int:
        """Padding id (the EOD id unless the backend has its own)."""
        return self.eod

    @property
    def eod_id(self) -> int:
        return self.eod

    @property
    def pad_id(self) -> int:
        return self.pad

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` (no EOD appended)."""

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text; backends with a faster batched path override this."""
        return [self.tokenize(t) for t in texts]

    @abstractmethod
    def detokenize(self, token_ids: Iterable[int]) -> str:
        """Text of `token_ids`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, eod={self.eod})"


def require_token_id(token_to_id: Callable[[str], int | None], tokens: str | Sequence[str],
                     role: str, source: str) -> int:
    """The id of the first of `tokens` in the vocabulary, or a ValueError naming them, their
    role and the file (A13)."""
    names = [tokens] if isinstance(tokens, str) else list(dict.fromkeys(t for t in tokens if t))
    for token in names:
        token_id = token_to_id(token)
        if token_id is not None:
            return int(token_id)
    which = (f"token {names[0]!r}" if len(names) == 1
             else f"token (one of {', '.join(map(repr, names))})")
    raise ValueError(
        f"the {role} {which} is not in the vocabulary of {source}; add it as a special token "
        "when training the tokenizer (train_bpe_tokenizer does) or use a tokenizer that "
        "defines it"
    )


def require_file(path: str | None, what: str, tokenizer_type: str,
                 key: str = "vocab_file") -> str:
    """`path` (config key `key`) if it is an existing file, else FileNotFoundError/ValueError
    naming it."""
    if not path:
        raise ValueError(f"{tokenizer_type} needs a {what}; set {key} in the config "
                         f"(--{key.replace('_', '-')} for the data tools)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{tokenizer_type}: {what} {path} does not exist")
    return str(path)
