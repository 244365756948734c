"""Tokenizers: one module per backend, chosen by name through `build_tokenizer`.

Backends: HFTokenizer (a `tokenizers` JSON file), GPT2BPETokenizer / HFGPT2Tokenizer (vocab.json
+ merges.txt), CharLevelTokenizer (UTF-8 bytes), SPMTokenizer (needs sentencepiece) and
TiktokenTokenizer (needs tiktoken). `train_bpe.train_bpe_tokenizer` trains a byte-level BPE.
"""

from megatron.tokenizer.abstract import AbstractTokenizer
from megatron.tokenizer.registry import TOKENIZERS, build_tokenizer

__all__ = ["AbstractTokenizer", "TOKENIZERS", "build_tokenizer"]
