"""Parameters marked `keep_fp32` (megatron/model/precision.py) stay fp32 in bf16/fp16 training.

DeepSpeed 0.19 casts every parameter of the module to the training dtype when the engine is
built (`DeepSpeedEngine._cast_module_mixed_precision`); it has no per-parameter exemption (its
`keep_in_fp32_modules` covers buffers only). GPT-NeoX gets one from DeeperSpeed's
`_deepspeed_no_cast` attribute. Here, while the engine is built, that cast is wrapped so that the
marked parameters get their fp32 tensors back afterwards, and the optimizer holds them in groups
of their own (megatron/training/optimizers.py): DeepSpeed's bf16, fp16 and ZeRO 1/2 optimizers
flatten each group into one buffer of one dtype, keep fp32 masters of it and copy the updated
masters back into the group's parameters, which for these groups are fp32 already. The forward
therefore reads exactly the fp32 values the optimizer updates.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from megatron.model.precision import kept_in_fp32


@contextlib.contextmanager
def fp32_through_engine_cast(model: torch.nn.Module) -> Iterator[int]:
    """While DeepSpeed builds an engine for `model`, its cast of the parameters to the training
    dtype leaves the parameters marked `keep_fp32` in fp32. Yields how many are kept."""
    kept = kept_in_fp32(model)
    if not kept:
        yield 0
        return
    from deepspeed.runtime.engine import DeepSpeedEngine

    cast = getattr(DeepSpeedEngine, "_cast_module_mixed_precision", None)
    if cast is None:
        import deepspeed

        raise RuntimeError(
            f"DeepSpeed {deepspeed.__version__} casts the model's parameters somewhere this "
            "framework does not know (DeepSpeedEngine._cast_module_mixed_precision is gone), so "
            "the parameters mamba_selective_fp32_params keeps in fp32 would be cast: install "
            "DeepSpeed 0.19 (requirements/requirements.txt), or set "
            "mamba_selective_fp32_params to false")

    def cast_keeping_fp32(engine, *args, **kwargs):
        saved = [(p, p.data) for p in kept]
        cast(engine, *args, **kwargs)
        for param, data in saved:
            param.data = data

    DeepSpeedEngine._cast_module_mixed_precision = cast_keeping_fp32
    try:
        yield len(kept)
    finally:
        DeepSpeedEngine._cast_module_mixed_precision = cast
