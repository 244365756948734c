"""Key/value cache for incremental decoding: preallocated per layer, filled as tokens arrive.

`KVCache(...)` holds, for each transformer layer, keys and values [b, kv_heads, max_len, d]
(this rank's KV heads under tensor parallelism) and an optional key-padding mask [b, max_len]
(True = a real token) for batches of prompts of different lengths, left-padded.
A forward pass over s new tokens writes positions [length, length + s) of every layer, then
`advance(s)` moves the length on. Mamba layers (`mamba_layers`) keep no keys or values but a
recurrent state of fixed size (megatron/model/mamba.py's MambaState).
"""

from __future__ import annotations

import torch

from megatron.model.param_count import kv_cache_elements


def kv_cache_bytes(num_layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int,
                   dtype: torch.dtype) -> int:
    """Memory the cache will take: keys and values of every layer (A29)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return kv_cache_elements(num_layers, batch, max_len, kv_heads, head_dim) * itemsize


class LayerCache:
    """One layer's view of the cache."""

    def __init__(self, cache: "KVCache", layer: int):
        self.cache, self.layer = cache, layer

    @property
    def offset(self) -> int:
        return self.cache.length

    def mamba_state(self):
        """This Mamba layer's convolution and scan state (empty before the prompt)."""
        return self.cache.states[self.layer]

    def keep(self, steps: int) -> torch.Tensor | None:
        """The key-padding mask of the next `steps` positions ([b, steps], True = a real
        token), or None without padding."""
        c = self.cache
        return None if c.key_padding is None else c.key_padding[:, c.length:c.length + steps]

    def update(self, k: torch.Tensor, v: torch.Tensor):
        """Store k, v [b, kv, s, d] after the cached prefix; return all keys and values so far
        and the key-padding mask over them ([b, L] or None)."""
        c, start = self.cache, self.cache.length
        end = start + k.shape[2]
        if end > c.max_len:
            raise RuntimeError(f"KV cache of {c.max_len} positions is full (asked for {end}); "
                               "build it with a larger max_len")
        c.keys[self.layer][:, :, start:end] = k
        c.values[self.layer][:, :, start:end] = v
        keep = None if c.key_padding is None else c.key_padding[:, :end]
        return c.keys[self.layer][:, :, :end], c.values[self.layer][:, :, :end], keep


class KVCache:
    """Keys and values of every layer for a batch being generated."""

    def __init__(self, num_layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 key_padding: torch.Tensor | None = None, mamba_layers: frozenset[int] = frozenset()):
        from megatron.model.mamba import MambaState

        shape = (batch, kv_heads, max_len, head_dim)

        def zeros(i):
            return None if i in mamba_layers else torch.zeros(shape, dtype=dtype, device=device)

        self.keys = [zeros(i) for i in range(num_layers)]
        self.values = [zeros(i) for i in range(num_layers)]
        self.states = {i: MambaState() for i in mamba_layers}
        self.max_len = max_len
        self.length = 0
        self.key_padding = key_padding  # [b, max_len] bool, True = real token

    def layer(self, index: int) -> LayerCache:
        return LayerCache(self, index)

    def advance(self, steps: int) -> None:
        self.length += steps
