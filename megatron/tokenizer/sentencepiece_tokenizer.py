"""`SPMTokenizer`: a SentencePiece model (needs the optional `sentencepiece` package)."""

from __future__ import annotations

from typing import Iterable

from megatron.tokenizer.abstract import AbstractTokenizer, require_file, require_token_id

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>")
PAD_CANDIDATES = ("<|padding|>", "<pad>")


def _import_sentencepiece():
    try:
        import sentencepiece
    except ImportError as err:
        raise ImportError("SPMTokenizer needs the sentencepiece package: "
                          "pip install sentencepiece") from err
    return sentencepiece


class SPMTokenizer(AbstractTokenizer):
    """EOD is the first of "<|endoftext|>", "</s>", "<eos>" in the model; pad "<|padding|>" or
    "<pad>" when present, else EOD."""

    def __init__(self, vocab_file: str | None):
        super().__init__("SPMTokenizer")
        spm = _import_sentencepiece()
        path = require_file(vocab_file, "SentencePiece model file (vocab_file)", self.name)
        self.tokenizer = spm.SentencePieceProcessor(model_file=path)
        vocab = {self.tokenizer.id_to_piece(i): i for i in range(self.tokenizer.get_piece_size())}
        self._eod = eod = require_token_id(vocab.get, EOD_CANDIDATES, "end-of-document", path)
        self._pad = next((vocab[t] for t in PAD_CANDIDATES if t in vocab), eod)
        self._vocab_size = len(vocab)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_token_id(self) -> int:
        return self._vocab_size - 1

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def pad(self) -> int:
        return self._pad

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def detokenize(self, token_ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in token_ids])
