"""Low-precision matrix products on CPU tensors: bf16/fp16 operands multiplied as fp32 where faster.

A bf16 (or fp16) matmul kernel multiplies the operands exactly (a product of two 8-bit, or
11-bit, mantissas fits fp32's 24), sums in fp32 and rounds the result to bf16 once. Casting the
operands to fp32, multiplying with the fp32 kernel and rounding the result computes the same
thing; only the order of the fp32 sums may differ, as between any two kernels. Which is faster
depends on the CPU, and flags do not tell: on one 2-core AVX-512 (avx512_bf16) machine torch's
bf16 kernel did 168 GFLOP/s against 288 in fp32 for a [2048, 768] x [768, 3072] product (and
SDPA's backward was twice as slow), on another with the same flags 424 against 181. The key
`cpu_matmul_precision` picks:

- fp32: operands cast to fp32 for the product, the result rounded back. Linear layers keep only
  their bf16 inputs for the backward (cast again there); attention keeps fp32 q, k, v.
- native: torch's bf16/fp16 kernels.
- auto (default): native where the CPU has AMX tiles for the dtype (amx_bf16, amx_fp16);
  elsewhere whichever of the two multiplies a [2048, 1024] x [1024, 1024] product faster,
  timed once per run (`measured_choice`). A training run that resumes a checkpoint keeps the
  choice the checkpoint records, so that it continues bit for bit.

GPU tensors and fp32 tensors always take torch's kernels.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from megatron.host import cpu_flags, fp32_products  # noqa: F401 (re-exported)

LOW_PRECISION = (torch.bfloat16, torch.float16)


def describe(setting: str, why: str = "") -> str:
    """The startup line: which kernels multiply bf16/fp16 CPU tensors, and why (`why`, for a
    setting `auto` resolved to fp32 or native)."""
    if setting == "auto":  # not resolved: what the AMX flag suggests (host.fp32_products)
        why = why or ("the CPU has AMX tiles" if "amx_bf16" in cpu_flags() else
                      "the CPU has no AMX tiles")
    why = f"cpu_matmul_precision: auto, {why}" if why else f"cpu_matmul_precision: {setting}"
    if fp32_products(setting):
        return (f"bf16/fp16 products on CPU tensors run as fp32 products rounded back ({why}); "
                "set cpu_matmul_precision: native for torch's low-precision kernels")
    return (f"bf16/fp16 products on CPU tensors run torch's low-precision kernels ({why}); "
            "set cpu_matmul_precision: fp32 for fp32 products")


def measured_choice(dtype: torch.dtype, rows: int = 2048, width: int = 1024, repeats: int = 3
                    ) -> tuple[str, str]:
    """('native' or 'fp32', why) for `cpu_matmul_precision: auto` on this CPU: native where it
    has AMX tiles for `dtype`, else the faster of torch's `dtype` kernel and the fp32 path (cast,
    fp32 product, round back) on a [rows, width] x [width, width] product, the best of `repeats`
    timings each, interleaved. A `dtype` product torch cannot run here is fp32."""
    import time

    amx = {torch.bfloat16: "amx_bf16", torch.float16: "amx_fp16"}[dtype]
    if amx in cpu_flags():
        return "native", f"the CPU has AMX tiles ({amx})"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=gen).to(dtype)
    w = torch.randn(width, width, generator=gen).to(dtype)
    paths = {"native": lambda: F.linear(x, w),
             "fp32": lambda: F.linear(x.float(), w.float()).to(dtype)}
    times: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for _ in range(repeats + 1):  # the first round warms both up and is not counted
            for name, product in paths.items():
                start = time.perf_counter()
                product()
                times[name].append(time.perf_counter() - start)
    except RuntimeError as err:
        return "fp32", f"torch's {dtype_name(dtype)} product fails on this CPU ({err})"
    best = {name: min(seconds[1:]) for name, seconds in times.items()}
    flops = 2 * rows * width * width
    rate = {name: flops / seconds / 1e9 for name, seconds in best.items()}
    choice = "native" if best["native"] < best["fp32"] else "fp32"
    return choice, (f"measured on this CPU: {rate['native']:.0f} GFLOP/s in {dtype_name(dtype)} "
                    f"against {rate['fp32']:.0f} as fp32 products")


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def upcast(x: torch.Tensor, enabled: bool) -> bool:
    """Whether a product with operand x runs in fp32: enabled, a CPU tensor, bf16 or fp16."""
    return enabled and x.dtype in LOW_PRECISION and x.device.type == "cpu"


class _Fp32Linear(torch.autograd.Function):
    """x W^T + b with the products in fp32, the results (and gradients) in the operands' dtype;
    saves only the low-precision x and W."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.bias_dtype = None if bias is None else bias.dtype
        y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        g = grad_y.float()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (g @ weight.float()).to(x.dtype)  # [..., in]
        if ctx.needs_input_grad[1]:
            grad_w = (g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1]).float())
            grad_w = grad_w.to(weight.dtype)  # [out, in]
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = g.reshape(-1, g.shape[-1]).sum(0).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           fp32: bool = False) -> torch.Tensor:
    """F.linear(x, weight, bias); with fp32=True and bf16/fp16 CPU operands, the products run
    in fp32 and the result is rounded to x's dtype."""
    if upcast(x, fp32) and weight.dtype == x.dtype:
        return _Fp32Linear.apply(x, weight, bias)
    return F.linear(x, weight, bias)



def resolve(setting: str, precision: str, device_type: str,
            recorded: Callable[[], tuple[str, str] | None] = lambda: None) -> tuple[str, str]:
    """(setting, why) the model of this rank is built with: `auto` of a bf16/fp16 run on CPU
    tensors becomes fp32 or native, the same on every rank (rank 0 decides): `recorded()`'s
    (setting, why), the choice of a checkpoint a resumed run keeps, where it gives one, else
    `measured_choice`. Anything else is returned as it is, with why "". Collective where it
    decides (a failure on rank 0 is raised on every rank)."""
    import torch.distributed as dist

    if setting != "auto" or precision not in ("bf16", "fp16") or device_type != "cpu":
        return setting, ""
    group = dist.is_available() and dist.is_initialized()
    decided = None
    if not group or dist.get_rank() == 0:
        try:
            decided = recorded() or measured_choice(
                torch.bfloat16 if precision == "bf16" else torch.float16)
        except Exception as err:  # noqa: BLE001 (raised below, on every rank)
            decided = ("", f"{type(err).__name__}: {err}")
    if group:
        box = [decided]
        dist.broadcast_object_list(box, src=0)
        decided = box[0]
    setting, why = decided
    if not setting:
        raise RuntimeError(f"cpu_matmul_precision: auto could not be decided on rank 0 ({why})")
    return setting, why
