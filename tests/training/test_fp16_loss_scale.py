"""fp16 with dynamic loss scaling, on CPU: DeepSpeed 0.19 leaves the loss scale of its fp16
wrapper without ZeRO unapplied (engine.unapplied_loss_scale); the training step applies it, so
an overflow is seen, skipped and lowers the scale, and a checkpoint keeps the scale.

Users' fp16 runs need CUDA (deepy.py refuses fp16 on CPU); DeepSpeed's fp16 wrapper itself is
the same code on any device, so this test lifts that refusal inside its worker to run the
scenario of the GPU tier (tests/gpu/test_cuda.py) here too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import run_distributed
from tests.gpu.test_cuda import _fp16_scaler, check_fp16_scaler


def allow_fp16_on_cpu() -> None:
    """Lift our refusal of fp16 on CPU, and DeepSpeed's where oneDNN has no fp16 kernels
    (CPUs without AVX-512 FP16 or AMX): the step's products run in fp32 there anyway
    (cpu_matmul_precision auto times torch's slow fp16 kernel against them,
    megatron/mpu/products.py)."""
    from deepspeed.accelerator import get_accelerator

    import megatron.training.engine as engine

    engine.check_precision_supported = lambda precision: None
    type(get_accelerator()).is_fp16_supported = lambda self: True


def _on_cpu(rank, world, directory: Path, pipe: int) -> dict:
    allow_fp16_on_cpu()
    return _fp16_scaler(rank, world, directory, pipe)


@pytest.mark.parametrize("pipe", [0, 1], ids=["plain", "pipeline"])
def test_fp16_overflow_skips_the_step_lowers_the_scale_and_resume_keeps_it(tmp_path, pipe):
    check_fp16_scaler(run_distributed(_on_cpu, 1, tmp_path, pipe, join=False)[0], "cpu")
