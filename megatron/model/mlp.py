"""The feed-forward block: h -> intermediate (x2 for gated activations) -> h."""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.activations import GATED, get_activation
from megatron.model.partition import Sharding
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.layers import ColumnParallelLinear, RowParallelLinear


class MLP(nn.Module):
    """dense_h_to_4h, activation, dense_4h_to_h (GPT-NeoX's names); the intermediate width is
    split over tensor-parallel ranks (for gated activations, value and gate halves separately)."""

    def __init__(self, config, init_fn, out_init_fn, gen: torch.Generator, tp: TensorParallel = NO_TP):
        super().__init__()
        ffn = config.intermediate_size
        gated = config.activation in GATED
        bias = config.use_bias_in_mlp
        split = Sharding.for_model(config).split_of("mlp.dense_h_to_4h.weight")
        self.dense_h_to_4h = ColumnParallelLinear(config.hidden_size, 2 * ffn if gated else ffn,
                                                  init_fn, gen, tp, bias=bias,
                                                  stride_groups=split.blocks)
        self.activation = get_activation(config.activation)
        self.dense_4h_to_h = RowParallelLinear(ffn, config.hidden_size, out_init_fn, gen, tp,
                                               bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [b, s, h] -> [b, s, up/tp] -> [b, s, ffn/tp] -> [b, s, h]
        return self.dense_4h_to_h(self.activation(self.dense_h_to_4h(x)))
