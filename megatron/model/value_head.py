"""The value head of a reward model (`train_impl: rm`): one number per position, in place of the
LM head. GPT-NeoX's rm_linear: a linear map hidden -> 1 without bias, initialised like the
output layer.

The weight [1, h] is replicated on tensor-parallel ranks (the final hidden state is whole on
each); with sequence parallelism the sequence is gathered first. Its canonical name is
`<num_layers + 2>.value.weight`, so an LM head's weights never load into it, nor it into one.
"""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.init import init_methods, layer_generator
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.mappings import gather_from_sequence_parallel


class ValueHead(nn.Module):
    """hidden [b, s, h] (or its sequence shard) -> values [b, s] in fp32."""

    def __init__(self, config, tp: TensorParallel = NO_TP):
        super().__init__()
        self.tp = tp
        self.value = nn.Linear(config.hidden_size, 1, bias=False)
        _, output_init = init_methods(config)
        with torch.no_grad():
            weight = torch.empty(1, config.hidden_size)
            output_init(weight, layer_generator(config.seed, config.num_layers + 1))
            self.value.weight.copy_(weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.tp.sequence_parallel:
            hidden = gather_from_sequence_parallel(hidden, self.tp)
        return self.value(hidden).squeeze(-1).float()  # [b, s]
