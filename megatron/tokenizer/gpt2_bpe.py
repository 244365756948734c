"""GPT-2 style byte-level BPE from `vocab.json` + `merges.txt`, loaded with `tokenizers`."""

from __future__ import annotations

import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from megatron.tokenizer.abstract import require_file
from megatron.tokenizer.hf import EOD_TOKEN, PAD_TOKEN, TokenizersBackend


def _resolve(vocab_file: str | None, merge_file: str | None, name: str) -> tuple[str, str]:
    """(vocab.json, merges.txt); `vocab_file` may also be a directory holding both."""
    if vocab_file and os.path.isdir(vocab_file) and merge_file is None:
        vocab_file, merge_file = (os.path.join(vocab_file, "vocab.json"),
                                  os.path.join(vocab_file, "merges.txt"))
    return (require_file(vocab_file, "vocab file (vocab.json)", name),
            require_file(merge_file, "merge file (merges.txt)", name, "merge_file"))


def load_byte_level_bpe(vocab_file: str, merge_file: str) -> Tokenizer:
    """GPT-2's byte-level BPE: ByteLevel pre-tokenizer and decoder, no prefix space."""
    try:
        model = models.BPE.from_file(vocab_file, merge_file)
    except Exception as err:  # tokenizers raises its own Exception subclass
        raise ValueError(f"cannot load BPE from {vocab_file} and {merge_file}: {err}") from err
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


class GPT2BPETokenizer(TokenizersBackend):
    """GPT-2's tokenizer files; EOD "<|endoftext|>" must be in vocab.json. Pad is EOD."""

    def __init__(self, vocab_file: str | None, merge_file: str | None,
                 name: str = "GPT2BPETokenizer"):
        vocab_file, merge_file = _resolve(vocab_file, merge_file, name)
        tokenizer = load_byte_level_bpe(vocab_file, merge_file)
        if tokenizer.token_to_id(EOD_TOKEN) is not None:
            tokenizer.add_special_tokens([EOD_TOKEN])  # reuses its id; never split in text
        self._extend(tokenizer)
        super().__init__(name, tokenizer, vocab_file)

    def _extend(self, tokenizer: Tokenizer) -> None:
        """Hook for subclasses adding tokens."""


class HFGPT2Tokenizer(GPT2BPETokenizer):
    """GPT-2 BPE plus a "<|padding|>" token appended as the pad id (GPT-NeoX's HFGPT2Tokenizer).

    Reads local files only: `vocab_file` is vocab.json (or a directory with vocab.json and
    merges.txt), `merge_file` merges.txt.
    """

    def __init__(self, vocab_file: str | None, merge_file: str | None = None):
        super().__init__(vocab_file, merge_file, name="HFGPT2Tokenizer")

    def _extend(self, tokenizer: Tokenizer) -> None:
        tokenizer.add_special_tokens([PAD_TOKEN])
