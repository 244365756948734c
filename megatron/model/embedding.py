"""Token (and learned/sinusoidal position) embedding; also the LM head when weights are tied."""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.init import init_methods, layer_generator
from megatron.model.positional import sinusoidal_table


class Embedding(nn.Module):
    """word embeddings [+ position embeddings] -> dropout."""

    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.position_embeddings = None
        if config.pos_emb == "learned":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        if config.pos_emb == "sinusoidal":
            table = sinusoidal_table(config.max_position_embeddings, config.hidden_size)
            self.register_buffer("sinusoidal", table, persistent=False)
        else:
            self.sinusoidal = None
        self.dropout = nn.Dropout(config.hidden_dropout)
        init_fn, _ = init_methods(config)
        gen = layer_generator(config.seed, 0)
        init_fn(self.word_embeddings.weight, gen)
        if self.position_embeddings is not None:
            init_fn(self.position_embeddings.weight, gen)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(tokens)  # [b, s, h]
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(position_ids)
        elif self.sinusoidal is not None:
            x = x + self.sinusoidal[position_ids].to(x.dtype)
        return self.dropout(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied LM head: hidden [b, s, h] -> logits [b, s, vocab]."""
        return torch.matmul(hidden, self.word_embeddings.weight.t())


class EmbeddingPipe(Embedding):
    """Embedding over the pipeline tuple (tokens, position_ids, mask) -> (hidden, position_ids, mask)."""

    def forward(self, inputs):  # type: ignore[override]
        tokens, position_ids, mask = inputs
        return super().forward(tokens, position_ids), position_ids, mask


def tied_lm_head(embedding: EmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    """forward_fn of the tied embedding spec on the last stage: hidden -> logits."""
    return embedding.logits(hidden)
