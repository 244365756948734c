"""Parameters that stay in fp32 while the rest of the model runs in bf16 or fp16.

A parameter with the attribute `keep_fp32` set (Mamba's A_log and D under
`mamba_selective_fp32_params`, as GPT-NeoX marks them) is never cast to the model's lower
precision: not by the training engine (megatron/training/fp32_params.py), not when a checkpoint
is loaded for generation or eval (`to_dtype`). Its forward reads the fp32 tensor itself.
"""

from __future__ import annotations

import torch
from torch import nn


def kept_in_fp32(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of `module` marked `keep_fp32`, each once."""
    return [p for p in module.parameters() if getattr(p, "keep_fp32", False)]


def to_dtype(module: nn.Module, dtype: torch.dtype, device: torch.device | str | None = None
             ) -> nn.Module:
    """`module.to(device, dtype)`, except that parameters marked `keep_fp32` stay fp32."""
    kept = [(p, p.data.to(device=device, dtype=torch.float32)) for p in kept_in_fp32(module)]
    module.to(device=device, dtype=dtype)
    for param, data in kept:
        param.data = data
    return module
