"""Token (and learned/sinusoidal position) embedding; also the LM head when weights are tied."""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.init import init_methods, layer_generator
from megatron.model.positional import sinusoidal_table
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.layers import VocabParallelEmbedding
from megatron.mpu.products import linear
from megatron.mpu.mappings import (copy_to_tensor_parallel, gather_from_sequence_parallel,
                                   scatter_to_tensor_parallel)


class Embedding(nn.Module):
    """word embeddings [+ position embeddings] -> dropout; vocabulary split over tp ranks."""

    def __init__(self, config, tp: TensorParallel = NO_TP):
        super().__init__()
        self.tp = tp
        self.fp32_products = config.fp32_products  # bf16/fp16 CPU LM head in fp32 (products.py)
        init_fn, _ = init_methods(config)
        gen = layer_generator(config.seed, 0)
        self.word_embeddings = VocabParallelEmbedding(config.padded_vocab_size, config.hidden_size,
                                                      init_fn, gen, tp)
        self.position_embeddings = None
        if config.pos_emb == "learned":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
            init_fn(self.position_embeddings.weight, gen)
        if config.pos_emb == "sinusoidal":
            table = sinusoidal_table(config.max_position_embeddings, config.hidden_size)
            self.register_buffer("sinusoidal", table, persistent=False)
        else:
            self.sinusoidal = None
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(tokens)  # [b, s, h] ([b, s/tp, h] with sequence parallelism)
        pos = None
        if self.position_embeddings is not None:
            pos = self.position_embeddings(position_ids)
        elif self.sinusoidal is not None:
            pos = self.sinusoidal[position_ids].to(x.dtype)
        if pos is not None:
            if self.tp.sequence_parallel:
                pos = scatter_to_tensor_parallel(pos, self.tp, dim=1)
            x = x + pos
        if self.tp.sequence_parallel:
            with self.tp.split_region_rng():
                return self.dropout(x)
        return self.dropout(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied LM head: hidden -> this rank's vocabulary slice of the logits [b, s, V/tp]."""
        if self.tp.sequence_parallel:
            hidden = gather_from_sequence_parallel(hidden, self.tp)
        else:
            hidden = copy_to_tensor_parallel(hidden, self.tp)
        return linear(hidden, self.word_embeddings.weight, fp32=self.fp32_products)


class EmbeddingPipe(Embedding):
    """Embedding over the pipeline tuple (tokens, position_ids, mask) -> (hidden, position_ids, mask)."""

    def forward(self, inputs):  # type: ignore[override]
        tokens, position_ids, mask = inputs
        return super().forward(tokens, position_ids), position_ids, mask


def tied_lm_head(embedding: EmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    """forward_fn of the tied embedding spec on the last stage: hidden -> logits."""
    return embedding.logits(hidden)
