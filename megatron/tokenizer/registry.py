"""`build_tokenizer`: the tokenizer registry, keyed by GPT-NeoX's `tokenizer_type` names."""

from __future__ import annotations

import logging
import os
from typing import Callable

from megatron.monitoring.logger import get_logger
from megatron.tokenizer.abstract import AbstractTokenizer

logger = get_logger(__name__)

Factory = Callable[[str | None, str | None], AbstractTokenizer]


def _hf(vocab_file, merge_file):
    from megatron.tokenizer.hf import HFTokenizer
    return HFTokenizer(vocab_file)


def _gpt2_bpe(vocab_file, merge_file):
    from megatron.tokenizer.gpt2_bpe import GPT2BPETokenizer
    return GPT2BPETokenizer(vocab_file, merge_file)


def _hf_gpt2(vocab_file, merge_file):
    from megatron.tokenizer.gpt2_bpe import HFGPT2Tokenizer
    return HFGPT2Tokenizer(vocab_file, merge_file)


def _char_level(vocab_file, merge_file):
    from megatron.tokenizer.char_level import CharLevelTokenizer
    return CharLevelTokenizer()


def _spm(vocab_file, merge_file):
    from megatron.tokenizer.sentencepiece_tokenizer import SPMTokenizer
    return SPMTokenizer(vocab_file)


def _tiktoken(vocab_file, merge_file):
    from megatron.tokenizer.tiktoken_tokenizer import TiktokenTokenizer
    return TiktokenTokenizer(vocab_file)


TOKENIZERS: dict[str, Factory] = {
    "HFTokenizer": _hf,
    "GPT2BPETokenizer": _gpt2_bpe,
    "HFGPT2Tokenizer": _hf_gpt2,
    "CharLevelTokenizer": _char_level,
    "SPMTokenizer": _spm,
    "TiktokenTokenizer": _tiktoken,
}


def build_tokenizer(tokenizer_type: str, vocab_file: str | None = None,
                    merge_file: str | None = None) -> AbstractTokenizer:
    """The tokenizer registered as `tokenizer_type` (case-insensitive), loaded from its files."""
    by_lower = {name.lower(): name for name in TOKENIZERS}
    name = by_lower.get(str(tokenizer_type).lower())
    if name is None:
        raise ValueError(f"unknown tokenizer_type {tokenizer_type!r}; valid types: "
                         f"{', '.join(TOKENIZERS)}")
    tokenizer = TOKENIZERS[name](vocab_file, merge_file)
    # said once per process and files, and not again by the workers deepy.py started (it said
    # it before launching them; megatron.launching.stopping.LAUNCH_ID_VAR marks them)
    key = (name, vocab_file, merge_file)
    quiet = key in _ANNOUNCED or bool(os.environ.get("NEOX_LAUNCH_ID"))
    _ANNOUNCED.add(key)
    logger.log(logging.DEBUG if quiet else logging.INFO, "built %s: vocab_size %d, eod %d, "
               "pad %d", name, tokenizer.vocab_size, tokenizer.eod, tokenizer.pad)
    return tokenizer


_ANNOUNCED: set[tuple] = set()
