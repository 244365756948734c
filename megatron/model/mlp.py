"""The feed-forward block: h -> intermediate (x2 for gated activations) -> h."""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.activations import GATED, get_activation


class MLP(nn.Module):
    """dense_h_to_4h, activation, dense_4h_to_h (GPT-NeoX's names)."""

    def __init__(self, config):
        super().__init__()
        ffn = config.intermediate_size
        up = 2 * ffn if config.activation in GATED else ffn
        self.dense_h_to_4h = nn.Linear(config.hidden_size, up, bias=config.use_bias_in_mlp)
        self.activation = get_activation(config.activation)
        self.dense_4h_to_h = nn.Linear(ffn, config.hidden_size, bias=config.use_bias_in_mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [b, s, h] -> [b, s, up] -> [b, s, ffn] -> [b, s, h]
        return self.dense_4h_to_h(self.activation(self.dense_h_to_4h(x)))
