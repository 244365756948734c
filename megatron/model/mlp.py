"""The feed-forward block: h -> intermediate (x2 for gated activations) -> h."""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.activations import bias_gelu, fused_swiglu, get_activation
from megatron.model.config import GATED
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
                                                  stride_groups=split.blocks,
                                                  fp32_products=config.fp32_products)
        self.activation = get_activation(config.activation)
        if config.activation == "swiglu" and config.use_flashattn_swiglu:
            self.activation = fused_swiglu
        # GPT-NeoX's bias_gelu_fusion: tanh GELU, its bias added with it rather than in the matmul
        self.bias_gelu = config.activation == "gelu" and config.bias_gelu_fusion
        self.dense_4h_to_h = RowParallelLinear(ffn, config.hidden_size, out_init_fn, gen, tp,
                                               bias=bias, fp32_products=config.fp32_products)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [b, s, h] -> [b, s, up/tp] -> [b, s, ffn/tp] -> [b, s, h]
        if self.bias_gelu:
            up = bias_gelu(self.dense_h_to_4h(x, add_bias=False), self.dense_h_to_4h.bias)
        else:
            up = self.activation(self.dense_h_to_4h(x))
        return self.dense_4h_to_h(up)
