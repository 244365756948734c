"""One pre-norm transformer layer, sequential or GPT-J parallel residual, and its pipeline form."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from megatron.model.attention import SelfAttention
from megatron.model.fusions import triton_kernels, use_triton
from megatron.model.init import init_methods, layer_generator
from megatron.model.mlp import MLP
from megatron.model.moe import MoE
from megatron.model.norms import build_norm
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.layers import mark_sequence_parallel


class TransformerLayer(nn.Module):
    """x + attn(norm(x)), then + mlp(norm(x)); or with gpt_j_residual x + attn(n1(x)) + mlp(n2(x)).

    With sequence parallelism x is this rank's sequence shard [b, s/tp, h]; attention and MLP
    gather it and hand back a shard.
    """

    def __init__(self, config, layer_number: int, tp: TensorParallel = NO_TP):
        super().__init__()
        self.layer_number = layer_number
        self.tp = tp
        self.gpt_j_residual = config.gpt_j_residual
        self.gpt_j_tied = config.gpt_j_tied
        self.input_layernorm = build_norm(config)
        self.post_attention_layernorm = build_norm(config)
        mark_sequence_parallel(self.input_layernorm, tp)
        mark_sequence_parallel(self.post_attention_layernorm, tp)
        init_fn, out_init_fn = init_methods(config)
        gen = layer_generator(config.seed, layer_number + 1)
        self.attention = SelfAttention(config, layer_number, init_fn, out_init_fn, gen, tp)
        self.moe = config.is_moe_layer(layer_number)
        if self.moe:
            self.mlp = MoE(config, init_fn, out_init_fn, gen, tp)
        else:
            self.mlp = MLP(config, init_fn, out_init_fn, gen, tp)
        self.hidden_dropout = nn.Dropout(config.hidden_dropout)
        self.fused_dropout_add = config.bias_dropout_fusion

    def _add(self, residual: torch.Tensor, out: torch.Tensor, dropout: bool = True
             ) -> torch.Tensor:
        """residual + dropout(out); one Triton kernel with bias_dropout_fusion where it can run.
        Without `dropout` (an MoE layer's output, which GPT-NeoX adds undropped) residual + out."""
        p = self.hidden_dropout.p
        if not self.training or p == 0.0 or not dropout:
            return residual + out
        # with sequence parallelism each rank holds different tokens: its own random stream
        rng = self.tp.split_region_rng() if self.tp.sequence_parallel else contextlib.nullcontext()
        with rng:
            if self.fused_dropout_add and use_triton(out):
                return triton_kernels().bias_dropout_add(out, None, residual, p)
            return residual + self.hidden_dropout(out)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                doc_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        # x: [b, s, h]; `cache` is this layer's LayerCache when decoding incrementally
        if self.gpt_j_residual:
            attn_in = self.input_layernorm(x)
            mlp_in = attn_in if self.gpt_j_tied else self.post_attention_layernorm(x)
            attn_out = self.attention(attn_in, position_ids, doc_mask, cache)
            return self._add(self._add(x, attn_out), self.mlp(mlp_in), not self.moe)
        x = self._add(x, self.attention(self.input_layernorm(x), position_ids, doc_mask, cache))
        return self._add(x, self.mlp(self.post_attention_layernorm(x)), not self.moe)


def unpack_mask(mask: torch.Tensor) -> torch.Tensor | None:
    """Pipeline stages pass a 1-element placeholder when attention is plain causal."""
    return None if mask.dim() < 4 else mask


class TransformerLayerPipe(TransformerLayer):
    """A TransformerLayer taking and returning the pipeline tuple (hidden, position_ids, mask)."""

    def forward(self, inputs):  # type: ignore[override]
        hidden, position_ids, mask = inputs
        return super().forward(hidden, position_ids, unpack_mask(mask)), position_ids, mask
