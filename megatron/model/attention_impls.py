"""Attention kernels behind one signature: torch SDPA (default), a plain reference, flash-attn.

Each takes q [b, h, s, d], k and v [b, kv, s, d] (kv divides h), and either `mask=None` meaning
plain causal attention, or an additive float mask / boolean keep-mask broadcastable to
[b, h, s, s]. They return [b, h, s, d].

Attention type `flash` (GPT-NeoX's Pythia, Llama and Mistral configs) runs flash-attn where it
is installed and the tensors are on CUDA; anywhere else torch SDPA computes the same attention
(its flash kernel on CUDA, its math kernel on CPU). Which one runs is logged once per process.
A sliding window (flash's causal `window_size=(W, -1)`: query i sees keys i-W .. i) is part of
the mask the attention module builds, so every kernel honours it.
"""

from __future__ import annotations

import importlib.util
import math

import torch
import torch.nn.functional as F

from megatron.model import cpu_attention
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)
_LOGGED: set[str] = set()


def sdpa_attention(q, k, v, mask, dropout_p: float, softmax_fp32: bool) -> torch.Tensor:
    """torch's scaled_dot_product_attention (picks a fused CPU/GPU kernel by itself), or, for
    the CPU bf16 and fp32 calls it is faster at, our blocked kernel
    (megatron/model/cpu_attention.py)."""
    del softmax_fp32  # SDPA accumulates the softmax in fp32 already
    if cpu_attention.supports(q, k, mask, dropout_p):
        _log_once("cpu", cpu_attention.PATH_LINE)
        return cpu_attention.blocked_causal_attention(q, k, v)
    gqa = k.shape[1] != q.shape[1]
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p,
                                              enable_gqa=gqa)
    if mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                          enable_gqa=gqa)


def reference_attention(q, k, v, mask, dropout_p: float, softmax_fp32: bool) -> torch.Tensor:
    """Attention written out with matmul and softmax: the reference the kernels are tested against."""
    b, h, s, d = q.shape
    if k.shape[1] != h:
        k = k.repeat_interleave(h // k.shape[1], dim=1)
        v = v.repeat_interleave(h // v.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)  # [b, h, s, s]
    if softmax_fp32:
        scores = scores.float()
    if mask is None:
        causal = torch.ones(s, k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    elif mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask.to(scores.dtype)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    probs = F.dropout(probs, p=dropout_p, training=dropout_p > 0)
    return torch.matmul(probs, v)


def flash_attention(q, k, v, mask, dropout_p: float, softmax_fp32: bool) -> torch.Tensor:
    """flash-attn's kernel (CUDA, fp16/bf16); causal only: masks go through SDPA instead."""
    from flash_attn import flash_attn_func  # optional extra: requirements-flashattention.txt

    if mask is not None or not q.is_cuda:
        return sdpa_attention(q, k, v, mask, dropout_p, softmax_fp32)
    # flash-attn wants [b, s, h, d]
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          dropout_p=dropout_p, causal=True)
    return out.transpose(1, 2)


ATTENTION_IMPLS = {"sdpa": sdpa_attention, "reference": reference_attention,
                   "flash": flash_attention}


def attention_impl(attention_type: str):
    """The kernel for a layer's attention type: `flash` is flash-attn when it is installed,
    else torch SDPA; the others are SDPA. Logs the choice once per process and type."""
    if attention_type == "flash":
        installed = importlib.util.find_spec("flash_attn") is not None
        _log_once("flash", "attention 'flash': " + (
            "flash-attn on CUDA tensors (masked or CPU inputs go through torch SDPA)"
            if installed else "flash-attn is not installed; torch SDPA computes the same "
            "attention (its flash kernel on CUDA, its math kernel on CPU)"))
        return flash_attention if installed else sdpa_attention
    return sdpa_attention


def _log_once(key: str, message: str) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info("%s", message)
