"""Low-precision matrix products on CPU tensors: bf16/fp16 operands multiplied as fp32 where faster.

A bf16 (or fp16) matmul kernel multiplies the operands exactly (a product of two 8-bit, or
11-bit, mantissas fits fp32's 24), sums in fp32 and rounds the result to bf16 once. Casting the
operands to fp32, multiplying with the fp32 kernel and rounding the result computes the same
thing; only the order of the fp32 sums may differ, as between any two kernels. On CPUs without
AMX tiles torch's bf16 kernels are slower than its fp32 ones: on this project's 2-core AVX-512
(avx512_bf16) test machine, 168 GFLOP/s in bf16 against 288 in fp32 for a [2048, 768] x
[768, 3072] product, and SDPA's backward twice as slow. The key `cpu_matmul_precision` picks:

- fp32: operands cast to fp32 for the product, the result rounded back. Linear layers keep only
  their bf16 inputs for the backward (cast again there); attention keeps fp32 q, k, v.
- native: torch's bf16/fp16 kernels.
- auto (default): fp32, unless the CPU has AMX tiles for the dtype (amx_bf16, amx_fp16).

GPU tensors and fp32 tensors always take torch's kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron.host import cpu_flags, fp32_products  # noqa: F401 (re-exported)

LOW_PRECISION = (torch.bfloat16, torch.float16)


def describe(setting: str) -> str:
    """The startup line: which kernels multiply bf16/fp16 CPU tensors, and why."""
    why = {"fp32": "cpu_matmul_precision: fp32", "native": "cpu_matmul_precision: native"}.get(
        setting, "cpu_matmul_precision: auto, " + (
            "the CPU has AMX tiles" if "amx_bf16" in cpu_flags() else "the CPU has no AMX tiles"))
    if fp32_products(setting):
        return (f"bf16/fp16 products on CPU tensors run as fp32 products rounded back ({why}); "
                "set cpu_matmul_precision: native for torch's low-precision kernels")
    return f"bf16/fp16 products on CPU tensors run torch's low-precision kernels ({why})"


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
