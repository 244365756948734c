"""Train a GPT-2 style byte-level BPE tokenizer with `tokenizers`; the JSON loads as HFTokenizer.

The special tokens come first, so with the defaults "<|endoftext|>" is id 0 and "<|padding|>"
id 1 (as in GPT-NeoX's 20B tokenizer). All 256 byte symbols are in the initial alphabet, so any
text round-trips.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from megatron.monitoring.logger import get_logger

logger = get_logger(__name__)


def train_bpe_tokenizer(text_iter_or_files: Iterable[str] | Sequence[os.PathLike | str],
                        vocab_size: int, output_path: str,
                        special_tokens: Sequence[str] = ("<|endoftext|>", "<|padding|>"),
                        min_frequency: int = 2) -> Tokenizer:
    """Train on texts (any iterable of str) or on a list of text files; write `output_path`.

    A list or tuple whose items are all existing file paths is read as files; anything else is
    an iterable of texts. The file is written to a temporary name and renamed into place.
    """
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size {vocab_size} is below the 256 byte symbols plus "
                         f"{len(special_tokens)} special tokens")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    if _is_file_list(text_iter_or_files):
        files = [str(f) for f in text_iter_or_files]
        tokenizer.train(files, trainer)
    else:
        tokenizer.train_from_iterator(iter(text_iter_or_files), trainer)
    output_path = str(output_path)
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    tmp = f"{output_path}.tmp-{os.getpid()}"
    tokenizer.save(tmp)
    os.replace(tmp, output_path)
    logger.info("trained byte-level BPE with %d tokens -> %s", tokenizer.get_vocab_size(),
                output_path)
    return tokenizer


def _is_file_list(source) -> bool:
    if isinstance(source, (str, bytes)) or not isinstance(source, (list, tuple)) or not source:
        return False
    return all(isinstance(s, (str, os.PathLike)) and os.path.isfile(s) for s in source)
