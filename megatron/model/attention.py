"""Causal self-attention with a fused QKV projection, grouped KV heads, rotary/ALiBi positions.

With tensor parallelism each rank holds num_kv_heads/tp KV groups and their query heads.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from megatron.model.attention_impls import attention_impl
from megatron.model.config import attention_window
from megatron.mpu.products import upcast
from megatron.model.positional import RotaryEmbedding, alibi_slopes
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.layers import ColumnParallelLinear, RowParallelLinear


def rotary_ndims(config) -> int:
    """Channels of each head that rotary rotates: int(head_dim * rotary_pct), as GPT-NeoX."""
    return int(config.head_dim * config.rotary_pct)


class SelfAttention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention of one transformer layer.

    The QKV projection is laid out per KV group as [q_per_kv queries, 1 key, 1 value] x head_dim,
    which for num_kv_heads == num_attention_heads is GPT-NeoX's interleaved [heads, 3, head_dim];
    splitting its rows evenly gives each tensor-parallel rank whole KV groups.
    """

    def __init__(self, config, layer_number: int, init_fn, out_init_fn, gen: torch.Generator,
                 tp: TensorParallel = NO_TP):
        super().__init__()
        if config.num_kv_heads % tp.size:
            raise ValueError(f"num_kv_heads({config.num_kv_heads}) is not divisible by "
                             f"model_parallel_size({tp.size})")
        self.tp = tp
        self.num_heads = config.num_attention_heads // tp.size
        self.num_kv = config.num_kv_heads // tp.size
        self.q_per_kv = self.num_heads // self.num_kv
        self.head_dim = config.head_dim
        self.dropout_p = config.attention_dropout
        self.softmax_fp32 = config.attention_softmax_in_fp32
        self.attention_type = config.attention_type(layer_number)
        self.window = attention_window(self.attention_type, config.sliding_window_width)
        self.kernel = attention_impl(self.attention_type)
        h, d = config.hidden_size, config.head_dim
        bias = config.use_bias_in_attn_linear
        qkv_out = (config.num_attention_heads + 2 * config.num_kv_heads) * d
        products = config.fp32_products
        self.fp32_products = products  # bf16/fp16 CPU attention in fp32 (mpu/products.py)
        self.query_key_value = ColumnParallelLinear(h, qkv_out, init_fn, gen, tp, bias=bias,
                                                    fp32_products=products)
        self.dense = RowParallelLinear(config.num_attention_heads * d, h, out_init_fn, gen, tp,
                                       bias=bias, fp32_products=products)
        self.rotary = None
        if config.pos_emb == "rotary":
            self.rotary = RotaryEmbedding(rotary_ndims(config), config.rotary_emb_base,
                                          config.max_position_embeddings, config.rope_fusion)
        if config.pos_emb == "alibi":
            slopes = alibi_slopes(config.num_attention_heads).chunk(tp.size)[tp.rank]
            self.register_buffer("alibi_slopes", slopes.contiguous(), persistent=False)
        else:
            self.alibi_slopes = None

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                doc_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """x [b, s, h] -> [b, s, h]. With `cache` (a LayerCache), x holds only the new tokens:
        their keys and values join the cached ones and queries attend over all of them."""
        qkv = self.query_key_value(x)  # [b, s, (heads + 2 kv) d / tp] (s: full sequence)
        b, s, _ = qkv.shape
        qkv = qkv.view(b, s, self.num_kv, self.q_per_kv + 2, self.head_dim)
        # one split (not three slices): its backward writes the QKV gradient once, where slices'
        # backwards each write a zero-filled QKV-sized tensor and then add them up
        q, k, v = qkv.split([self.q_per_kv, 1, 1], dim=3)
        q = q.reshape(b, s, self.num_heads, self.head_dim).transpose(1, 2)  # [b, heads, s, d]
        k = k.squeeze(3).transpose(1, 2)  # [b, kv, s, d]
        v = v.squeeze(3).transpose(1, 2)  # [b, kv, s, d]
        if self.rotary is not None:
            cos, sin = self.rotary.cos_sin(position_ids)
            q, k = self.rotary.rotate(q, cos, sin), self.rotary.rotate(k, cos, sin)
        offset, key_keep = 0, None
        if cache is not None:
            offset = cache.offset
            k, v, key_keep = cache.update(k, v)  # [b, kv, offset + s, d]
        mask = self._mask(s, k.shape[2], offset, doc_mask, key_keep, x.device)
        p = self.dropout_p if self.training else 0.0
        dtype = q.dtype
        if upcast(q, self.fp32_products):
            q, k, v = q.float(), k.float(), v.float()
        # each rank's heads draw their dropout from its own stream; without dropout nothing is
        # drawn, and the stream is not switched (a switch is a graph break under torch_compile)
        with self.tp.split_region_rng() if p > 0 else contextlib.nullcontext():
            out = self.kernel(q.contiguous(), k.contiguous(), v.contiguous(), mask, p,
                              self.softmax_fp32).to(dtype)
        out = out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)  # [b, s, h/tp]
        return self.dense(out)  # [b, s, h] (or [b, s/tp, h] with sequence parallelism)

    def _mask(self, s_q: int, s_k: int, offset: int, doc_mask: torch.Tensor | None,
              key_keep: torch.Tensor | None, device) -> torch.Tensor | None:
        """None for plain causal attention, else a keep-mask or additive bias [b|1, h|1, s_q, s_k].

        Query i sits at absolute position offset + i; key j at position j.
        """
        plain = offset == 0 and s_q == s_k and key_keep is None
        if plain and doc_mask is None and self.window is None and self.alibi_slopes is None:
            return None
        i = torch.arange(s_q, device=device).unsqueeze(1) + offset
        j = torch.arange(s_k, device=device).unsqueeze(0)
        keep = j <= i  # [s_q, s_k]
        if self.window is not None:
            keep = keep & (i - j < self.window)  # the window's keys, the query's own included
        keep = keep.view(1, 1, s_q, s_k)
        if doc_mask is not None:
            keep = keep & doc_mask  # doc_mask: [b, 1, s, s]
        if key_keep is not None:
            keep = keep & key_keep[:, None, None, :]  # padding of left-padded prompts
        if self.alibi_slopes is None:
            return keep
        bias = -(i - j).clamp(min=0).float() * self.alibi_slopes.view(-1, 1, 1)  # [h, s_q, s_k]
        return bias.unsqueeze(0).masked_fill(~keep, float("-inf"))
