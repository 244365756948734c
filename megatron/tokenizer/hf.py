"""`HFTokenizer`: a HuggingFace `tokenizers` JSON file.

The end-of-document token is "<|endoftext|>" (GPT-NeoX's); in a file without it, the
`eos_token` of the tokenizer_config.json beside the file (a Hugging Face tokenizer directory,
e.g. Llama 3's: the EOS its chat data is made with), else the first of EOD_FALLBACKS in it. The
pad is "<|padding|>", else that config's `pad_token`, else the end-of-document token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer

from megatron.tokenizer.abstract import AbstractTokenizer, require_file, require_token_id

EOD_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|padding|>"
EOD_FALLBACKS = ("<|end_of_text|>", "</s>", "<eos>")  # Llama 3; Llama 2, Mistral; Gemma


class TokenizersBackend(AbstractTokenizer):
    """Shared code for tokenizers built on a `tokenizers.Tokenizer`."""

    def __init__(self, name: str, tokenizer: Tokenizer, source: str,
                 eod_tokens: Sequence[str] = (EOD_TOKEN,),
                 pad_tokens: Sequence[str] = (PAD_TOKEN,)):
        super().__init__(name)
        self.tokenizer = tokenizer
        self.source = source
        self._eod = require_token_id(tokenizer.token_to_id, eod_tokens, "end-of-document", source)
        pad = next((tokenizer.token_to_id(t) for t in pad_tokens
                    if t and tokenizer.token_to_id(t) is not None), None)
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
            if _is_token_map(path):
                raise ValueError(
                    f"HFTokenizer: {path} is a map of tokens to ids (GPT-2's vocab.json), not a "
                    "tokenizers tokenizer.json: use tokenizer_type GPT2BPETokenizer with its "
                    "merges.txt as merge_file, or the model's tokenizer.json") from None
            raise ValueError(f"HFTokenizer: cannot load {path} as a tokenizers JSON file: "
                             f"{err}") from err
        beside = special_tokens_beside(path)
        super().__init__("HFTokenizer", tokenizer, path,
                         (EOD_TOKEN, beside.get("eos_token"), *EOD_FALLBACKS),
                         (PAD_TOKEN, beside.get("pad_token")))


def _is_token_map(path: str) -> bool:
    """Whether `path` holds a JSON object of token -> id, as GPT-2's vocab.json does."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(data, dict) and bool(data) and "model" not in data
            and all(isinstance(v, int) for v in list(data.values())[:100]))


def special_tokens_beside(path: str) -> dict[str, str]:
    """The special tokens (eos_token, pad_token, ...) the tokenizer_config.json in the folder of
    `path` names as text; none when it has no such file."""
    config = Path(path).parent / "tokenizer_config.json"
    try:
        settings = json.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise ValueError(f"HFTokenizer: cannot read {config} (the tokenizer's settings beside "
                         f"{path}): {err}") from err
    tokens = {}
    for key in ("eos_token", "pad_token"):
        value = settings.get(key) if isinstance(settings, dict) else None
        if isinstance(value, dict):  # an AddedToken written out: {"content": ..., ...}
            value = value.get("content")
        if isinstance(value, str) and value:
            tokens[key] = value
    return tokens
