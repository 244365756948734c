"""Checks made before generating: stop ids (A13) and KV-cache memory (A29); the lengths (A14)
are checked by prompts.check_lengths, which deepy.py runs too.

Each raises ValueError/RuntimeError with the numbers involved and what to change.
"""

from __future__ import annotations

import torch

from megatron.model.kv_cache import kv_cache_bytes

GIB = 1024**3
# share of the available memory the cache may take; the rest is for weights' activations/logits
KV_CACHE_MEMORY_SHARE = 0.9


def validate_stop_ids(stop_ids, vocab_size: int, eod: int, source: str = "stop_token_ids"
                      ) -> frozenset[int]:
    """A13: every stop id is a real token of the tokenizer; EOD is always included."""
    ids = set()
    for value in stop_ids or ():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{source} entry {value!r} is not a token id (an integer)")
        if not 0 <= value < vocab_size:
            raise ValueError(f"{source} entry {value} is not a token id of the tokenizer "
                             f"(ids are 0..{vocab_size - 1}); fix {source}")
        ids.add(value)
    if not 0 <= eod < vocab_size:
        raise ValueError(f"the tokenizer's EOD id {eod} is outside its vocabulary of {vocab_size}")
    return frozenset(ids | {eod})


def validate_stop_strings(stop_strings) -> tuple[str, ...]:
    """Stop strings must be non-empty strings (an empty one would stop before any text)."""
    out = []
    for s in stop_strings or ():
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop_strings entry {s!r} must be a non-empty string")
        out.append(s)
    return tuple(out)


def available_memory(device: torch.device) -> tuple[int, str]:
    """(bytes free for new tensors, where the figure comes from) on `device` (A29, A31)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free), f"torch.cuda.mem_get_info on {device}"
    import psutil

    return int(psutil.virtual_memory().available), "psutil available system memory"


def check_kv_cache_fits(num_layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int,
                        dtype: torch.dtype, device: torch.device,
                        available: tuple[int, str] | None = None) -> int:
    """A29: the cache's size from its shape; an error with both figures when it cannot fit.

    Returns the size in bytes."""
    need = kv_cache_bytes(num_layers, batch, max_len, kv_heads, head_dim, dtype)
    free, source = available if available is not None else available_memory(device)
    if need > KV_CACHE_MEMORY_SHARE * free:
        raise RuntimeError(
            f"the KV cache needs {need / GIB:.2f} GiB ({num_layers} layers x batch {batch} x "
            f"{max_len} positions x {kv_heads} KV heads x head_dim {head_dim} x keys and values "
            f"in {dtype}) but only {free / GIB:.2f} GiB is available ({source}); lower "
            "generation_batch_size or maximum_tokens, or set recompute: true")
    return need
