"""One pre-norm transformer layer, sequential or GPT-J parallel residual, and its pipeline form."""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.attention import SelfAttention
from megatron.model.init import init_methods, layer_generator
from megatron.model.mlp import MLP
from megatron.model.norms import build_norm


class TransformerLayer(nn.Module):
    """x + attn(norm(x)), then + mlp(norm(x)); or with gpt_j_residual x + attn(n1(x)) + mlp(n2(x))."""

    def __init__(self, config, layer_number: int):
        super().__init__()
        self.layer_number = layer_number
        self.gpt_j_residual = config.gpt_j_residual
        self.gpt_j_tied = config.gpt_j_tied
        self.input_layernorm = build_norm(config)
        self.post_attention_layernorm = build_norm(config)
        self.attention = SelfAttention(config, layer_number)
        self.mlp = MLP(config)
        self.hidden_dropout = nn.Dropout(config.hidden_dropout)
        self._init_weights(config)

    def _init_weights(self, config) -> None:
        init_fn, out_init_fn = init_methods(config)
        gen = layer_generator(config.seed, self.layer_number + 1)
        for linear, fn in ((self.attention.query_key_value, init_fn), (self.attention.dense, out_init_fn),
                           (self.mlp.dense_h_to_4h, init_fn), (self.mlp.dense_4h_to_h, out_init_fn)):
            fn(linear.weight, gen)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                doc_mask: torch.Tensor | None = None) -> torch.Tensor:
        # x: [b, s, h]
        if self.gpt_j_residual:
            attn_in = self.input_layernorm(x)
            mlp_in = attn_in if self.gpt_j_tied else self.post_attention_layernorm(x)
            attn_out = self.attention(attn_in, position_ids, doc_mask)
            return x + self.hidden_dropout(attn_out) + self.hidden_dropout(self.mlp(mlp_in))
        x = x + self.hidden_dropout(self.attention(self.input_layernorm(x), position_ids, doc_mask))
        return x + self.hidden_dropout(self.mlp(self.post_attention_layernorm(x)))


def unpack_mask(mask: torch.Tensor) -> torch.Tensor | None:
    """Pipeline stages pass a 1-element placeholder when attention is plain causal."""
    return None if mask.dim() < 4 else mask


class TransformerLayerPipe(TransformerLayer):
    """A TransformerLayer taking and returning the pipeline tuple (hidden, position_ids, mask)."""

    def forward(self, inputs):  # type: ignore[override]
        hidden, position_ids, mask = inputs
        return super().forward(hidden, position_ids, unpack_mask(mask)), position_ids, mask
