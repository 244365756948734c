"""DeepSpeed's bf16 optimizer and its ZeRO 1/2 optimizer without their per-parameter loops:
the same arithmetic in a few multi-tensor ops.

At each step DeepSpeed 0.19's `BF16_Optimizer` (bf16 weights, fp32 master weights, ZeRO 0 with
pipeline engines) walks the parameters in Python three times: it adds each bf16 gradient into
its accumulated gradient (`update_hp_grads`), takes each gradient's norm
(`get_global_norm_of_tensors`) and scales each one when clipping (`clip_tensors_by_global_norm`).
For a 125M-parameter GPT (148 parameters) that is about 1,300 operator calls a step, each a
kernel launch on a GPU, where the whole forward and backward make some 2,600: a small model's
step is bound by launching kernels. Its ZeRO stage 1/2 optimizer (`DeepSpeedZeroOptimizer`,
GPT-NeoX's configs run stage 1) looks for inf/NaN in each gradient fragment it owns (two
reductions and four more ops each) and takes each fragment's norm in fp64 through an fp64 copy.
`fuse(optimizer)` replaces these loops by `torch._foreach_add_`, `torch._foreach_norm` and
`torch._foreach_mul_` over the same tensors:

- the gradient sums are the same additions, into gradients of the dtype DeepSpeed accumulates
  in (bf16 for its pipeline engines by default);
- the norms are the same: each tensor's norm in the dtype DeepSpeed takes it in (fp32 for the
  bf16 optimizer, fp64 where the device has it for ZeRO), squared and summed, all-reduced over
  the same groups, the square root taken, inf/NaN marked -1 as DeepSpeed does. On a CPU
  `_foreach_norm` runs each tensor's norm kernel, so the result is bit for bit DeepSpeed's; a
  GPU's multi-tensor kernel may sum in another order;
- clipping multiplies by the same coefficient, only when it is below 1;
- a gradient holds inf or NaN exactly when its largest magnitude (the inf-norm, one
  multi-tensor op for all of them) is not finite, which is what DeepSpeed's max/min test finds.

What the loops do besides (`_hp_grad` links, the has-gradient marks, folding corrections of
expert-parallel auto TP, norms of expert gradients, another norm type, CPU offload, sparse
gradients) is kept, or handed back to DeepSpeed's own code where it applies.
"""

from __future__ import annotations

import functools

import torch

_PATCHED = False
# what the replacements read of each optimizer; another DeepSpeed without them keeps its loops
BF16_ATTRIBUTES = ("bf16_groups", "fp32_groups_gradients", "fp32_groups_has_gradients",
                   "immediate_grad_update")
ZERO_ATTRIBUTES = ("bit16_groups", "averaged_gradients", "model_parallel_rank",
                   "dp_process_group", "_model_parallel_all_reduce", "device", "cpu_offload")


def fuse(optimizer) -> bool:
    """Make `optimizer`'s step use multi-tensor ops where it is DeepSpeed's BF16_Optimizer or
    its ZeRO stage 1/2 optimizer (True), else leave it (False)."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if isinstance(optimizer, BF16_Optimizer) and _has(optimizer, BF16_ATTRIBUTES):
        _patch_norm_and_clip()
        optimizer.update_hp_grads = functools.partial(update_hp_grads, optimizer)
        return True
    if (isinstance(optimizer, DeepSpeedZeroOptimizer) and _has(optimizer, ZERO_ATTRIBUTES)
            and not optimizer.cpu_offload):
        optimizer.has_overflow_partitioned_grads_serial = functools.partial(
            partitioned_grads_overflow, optimizer)
        optimizer.get_grad_norm_direct = functools.partial(zero_grad_norm, optimizer)
        return True
    return False


def _has(optimizer, names: tuple[str, ...]) -> bool:
    return all(hasattr(optimizer, name) for name in names)


@torch.no_grad()
def partitioned_grads_overflow(optimizer) -> torch.Tensor:
    """DeepSpeedZeroOptimizer.has_overflow_partitioned_grads_serial: whether any gradient
    fragment this rank owns holds inf or NaN, as a one-element bool tensor on the device."""
    from deepspeed.accelerator import get_accelerator

    grads = [g for i in range(len(optimizer.bit16_groups))
             for g in optimizer.averaged_gradients[i] if g is not None]
    device = get_accelerator().current_device_name()
    if any(g.is_sparse for g in grads):
        return type(optimizer).has_overflow_partitioned_grads_serial(optimizer)
    grads = [g for g in grads if g.numel()]
    if not grads:
        return torch.zeros([1], dtype=torch.bool, device=device)
    largest = torch.stack(torch._foreach_norm(grads, float("inf"))).to(device)
    return largest.isfinite().all().logical_not().reshape(1)


@torch.no_grad()
def zero_grad_norm(optimizer, gradients, params, norm_type=2) -> torch.Tensor:
    """DeepSpeedZeroOptimizer.get_grad_norm_direct for the L2 norm: the fragments' norms in
    DeepSpeed's norm dtype, each counted once over the model-parallel group (replicated
    pipeline copies skipped, replicated parameters on tensor rank 0), squared and summed over
    the data- and model-parallel groups."""
    from deepspeed import comm as dist
    from deepspeed.runtime.constants import PIPE_REPLICATED
    from deepspeed.runtime.utils import (is_model_parallel_parameter,
                                         mask_nan_or_inf_with_val_inplace)
    from deepspeed.runtime.zero.utils import get_norm_dtype

    if float(norm_type) != 2.0:
        return type(optimizer).get_grad_norm_direct(optimizer, gradients, params, norm_type)
    counted = []
    for g, p in zip((g for g in gradients if not getattr(g, "_zero_padding", False)), params):
        if hasattr(p, PIPE_REPLICATED) and p.ds_pipe_replicated:
            continue
        if is_model_parallel_parameter(p) or optimizer.model_parallel_rank == 0:
            counted.append(g)
    if counted:
        norms = torch._foreach_norm(counted, 2.0, dtype=get_norm_dtype())
        total = torch.stack(norms).to(optimizer.device).pow(2.0).sum().float()
    else:
        total = torch.tensor(0.0, dtype=torch.float32).to(optimizer.device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=optimizer.dp_process_group)
    optimizer._model_parallel_all_reduce(tensor=total, op=dist.ReduceOp.SUM)
    total = total.pow(1.0 / 2.0)
    mask_nan_or_inf_with_val_inplace(total, device=optimizer.device)
    return total


@torch.no_grad()
def update_hp_grads(optimizer, clear_lp_grads: bool = False) -> None:
    """BF16_Optimizer.update_hp_grads: each bf16 gradient added into its fp32 gradient, one
    `_foreach_add_` per parameter group."""
    if optimizer.immediate_grad_update:
        return
    if getattr(optimizer, "autoep_folding_tp_group", None) is not None:  # corrections first
        type(optimizer).update_hp_grads(optimizer, clear_lp_grads)
        return
    for i, group in enumerate(optimizer.bf16_groups):
        hp_grads, lp_grads = [], []
        for j, lp in enumerate(group):
            if lp.grad is None:
                continue
            hp_grad = optimizer.fp32_groups_gradients[i][j]
            hp_grads.append(hp_grad)
            lp_grads.append(lp.grad.view(hp_grad.shape))
            lp._hp_grad = hp_grad
            optimizer.fp32_groups_has_gradients[i][j] = True
        if hp_grads:
            torch._foreach_add_(hp_grads, lp_grads)
            if clear_lp_grads:
                torch._foreach_zero_(lp_grads)


def _patch_norm_and_clip() -> None:
    """The norm and clipping functions BF16_Optimizer.step calls (names in its module), once per
    process; other callers of DeepSpeed's functions keep them."""
    global _PATCHED
    if _PATCHED:
        return
    import deepspeed.runtime.bf16_optimizer as bf16

    original_norm = bf16.get_global_norm_of_tensors

    def global_norm(input_tensors, norm_type=2, mpu=None, moe_ep_group=None):
        tensors = list(input_tensors)
        if float(norm_type) != 2.0 or moe_ep_group is not None or not tensors:
            return original_norm(tensors, norm_type=norm_type, mpu=mpu, moe_ep_group=moe_ep_group)
        return l2_global_norm(tensors, mpu)

    def clip(input_tensors, max_norm=1.0, global_norm=None, mpu=None, eps=1e-6):
        tensors = list(input_tensors)
        if global_norm is None:
            global_norm = bf16.get_global_norm_of_tensors(tensors, mpu=mpu)
        clip_coef = max_norm / (global_norm + eps)
        if tensors and clip_coef < 1:
            torch._foreach_mul_(tensors, clip_coef)
        return global_norm

    bf16.get_global_norm_of_tensors = global_norm
    bf16.clip_tensors_by_global_norm = clip
    _PATCHED = True


def l2_global_norm(tensors: list[torch.Tensor], mpu=None) -> torch.Tensor:
    """DeepSpeed's get_global_norm_of_tensors for the L2 norm and no expert group: each
    tensor's norm in fp32 (the gradients DeepSpeed accumulates may be bf16), squared and summed,
    all-reduced over mpu's model-parallel group, the square root taken, inf or NaN as -1."""
    from deepspeed import comm as dist
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.utils import mask_nan_or_inf_with_val_inplace

    device = get_accelerator().current_device_name()
    norms = torch._foreach_norm(tensors, 2.0, dtype=torch.float32)
    total = torch.stack(norms).to(device).pow(2.0).sum()
    if mpu is not None:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=mpu.get_model_parallel_group())
    total = total.to(tensors[0].device).pow(1.0 / 2.0)
    mask_nan_or_inf_with_val_inplace(total, device=total.device)
    return total
