"""Parameters marked keep_fp32 pass DeepSpeed's cast of the module to bf16 unchanged while an
engine is built, and only then (megatron/training/fp32_params.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron.training.fp32_params import fp32_through_engine_cast


def _model() -> torch.nn.Module:
    model = torch.nn.Linear(4, 4)
    model.A_log = torch.nn.Parameter(torch.full((4, 16), 1.001))  # a value bf16 cannot hold
    model.A_log.keep_fp32 = True
    return model


def _cast(model: torch.nn.Module) -> None:
    """DeepSpeed's own cast, as its engine runs it for bf16 (no ZeRO-Init, buffers kept)."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    DeepSpeedEngine._cast_module_mixed_precision(SimpleNamespace(module=model), torch.bfloat16,
                                                 None, False)


def test_marked_parameters_keep_their_fp32_tensors_through_deepspeeds_cast():
    model = _model()
    with fp32_through_engine_cast(model) as kept:
        _cast(model)
    assert kept == 1
    assert model.A_log.dtype == torch.float32 and torch.all(model.A_log == 1.001)
    assert model.weight.dtype == model.bias.dtype == torch.bfloat16

    after = _model()  # outside the context DeepSpeed's cast is its own again
    _cast(after)
    assert after.A_log.dtype == torch.bfloat16


def test_a_deepspeed_without_that_cast_is_named_with_the_key_to_turn_off(monkeypatch):
    from deepspeed.runtime.engine import DeepSpeedEngine

    monkeypatch.delattr(DeepSpeedEngine, "_cast_module_mixed_precision")
    with pytest.raises(RuntimeError, match=r"set mamba_selective_fp32_params to false"):
        with fp32_through_engine_cast(_model()):
            pass
    with fp32_through_engine_cast(torch.nn.Linear(2, 2)) as kept:  # nothing marked: no check
        assert kept == 0
