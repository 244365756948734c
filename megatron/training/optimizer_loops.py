"""DeepSpeed's bf16 optimizer, its ZeRO 1/2 optimizer and its fp16 wrapper without their
per-parameter loops: the same arithmetic in a few multi-tensor ops.

At each step DeepSpeed 0.19's `BF16_Optimizer` (bf16 weights, fp32 master weights, ZeRO 0 with
pipeline engines) walks the parameters in Python three times: it adds each bf16 gradient into
its accumulated gradient (`update_hp_grads`), takes each gradient's norm
(`get_global_norm_of_tensors`) and scales each one when clipping (`clip_tensors_by_global_norm`).
For a 125M-parameter GPT (148 parameters) that is about 1,300 operator calls a step, each a
kernel launch on a GPU, where the whole forward and backward make some 2,600: a small model's
step is bound by launching kernels. Its ZeRO stage 1/2 optimizer (`DeepSpeedZeroOptimizer`,
GPT-NeoX's configs run stage 1) looks for inf/NaN in each gradient fragment it owns (two
reductions and four more ops each) and takes each fragment's norm in fp64 through an fp64 copy.
DeepSpeed's fp16 wrapper with a torch optimizer (`FP16_UnfusedOptimizer`: every fp16 run, and
bf16 on a plain module, `pipe_parallel_size: 0`) tests each gradient for inf/NaN and reads the
answer back to the host, a device synchronisation per parameter, then takes each gradient's
norm and unscales each one. `fuse(optimizer)` replaces these loops by `torch._foreach_add_`,
`torch._foreach_norm` and `torch._foreach_mul_` over the same tensors:

- the gradient sums are the same additions, into gradients of the dtype DeepSpeed accumulates
  in (bf16 for its pipeline engines by default);
- the norms are the same: each tensor's norm in the dtype DeepSpeed takes it in (fp32 for the
  bf16 and fp16 optimizers, fp64 where the device has it for ZeRO), squared and summed (for the
  fp16 wrapper in DeepSpeed's order, in fp32, on the host after one read-back), all-reduced over
  the same groups, the square root taken, inf/NaN marked -1 as DeepSpeed does. On a CPU
  `_foreach_norm` runs each tensor's norm kernel, so the result is bit for bit DeepSpeed's; a
  GPU's multi-tensor kernel may sum in another order;
- clipping multiplies by the same coefficient, only when it is below 1 (the fp16 wrapper: by
  its combined unscale-and-clip factor);
- a gradient holds inf or NaN exactly when its largest magnitude (the inf-norm, one
  multi-tensor op for all of them) is not finite, which is what DeepSpeed's max/min test finds.

Besides, the bf16 optimizer's weights have their bf16 gradients dropped before each backward
rather than zeroed (`clear_lp_grads`): autograd then hands each gradient over as computed, where
it would add it into a zero-filled one, the same values with a fill and an addition fewer.

What the loops do besides (`_hp_grad` links, the has-gradient marks, folding corrections of
expert-parallel auto TP, norms of expert gradients, another norm type, CPU offload, sparse
gradients) is kept, or handed back to DeepSpeed's own code where it applies. The fp16 wrapper
still casts each gradient to an fp32 copy and copies each fp32 weight back, one call each per
parameter (its step allocates those copies afresh).
"""

from __future__ import annotations

import functools

import torch

_PATCHED: set[str] = set()  # module.function names replaced in this process
# what the replacements read of each optimizer; another DeepSpeed without them keeps its loops
BF16_ATTRIBUTES = ("bf16_groups", "fp32_groups_gradients", "fp32_groups_has_gradients",
                   "immediate_grad_update")
UNFUSED_ATTRIBUTES = ("fp32_groups", "loss_scale_config", "clip_grad", "overflow_checker")
ZERO_ATTRIBUTES = ("bit16_groups", "averaged_gradients", "model_parallel_rank",
                   "dp_process_group", "_model_parallel_all_reduce", "device", "cpu_offload")


def fuse(optimizer) -> bool:
    """Make `optimizer`'s step use multi-tensor ops where it is DeepSpeed's BF16_Optimizer, its
    ZeRO stage 1/2 optimizer or FP16_UnfusedOptimizer (True), else leave it (False)."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if isinstance(optimizer, BF16_Optimizer) and _has(optimizer, BF16_ATTRIBUTES):
        _patch_norm_and_clip()
        optimizer.update_hp_grads = functools.partial(update_hp_grads, optimizer)
        if not optimizer.immediate_grad_update:
            optimizer.clear_lp_grads = functools.partial(clear_lp_grads, optimizer)
        return True
    if (isinstance(optimizer, FP16_UnfusedOptimizer) and _has(optimizer, UNFUSED_ATTRIBUTES)
            and _has(optimizer.overflow_checker, ("params", "has_overflow_serial"))):
        _patch_weight_norm()
        optimizer.overflow_checker.has_overflow_serial = any_inf_or_nan
        optimizer.unscale_and_clip_grads = functools.partial(unscale_and_clip_grads, optimizer)
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
    return _not_finite(grads).to(device).reshape(1)


def _not_finite(grads: list[torch.Tensor]) -> torch.Tensor:
    """Whether any of `grads` (dense, none empty) holds inf or NaN, as a bool scalar on their
    device: exactly when the largest magnitude over all of them, one inf-norm, is not finite."""
    largest = torch.stack(torch._foreach_norm(grads, float("inf"))).max()
    return largest.isfinite().logical_not()


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


def clear_lp_grads(optimizer, set_to_none: bool = True) -> None:
    """BF16_Optimizer.clear_lp_grads, called before each backward: the bf16 gradients dropped
    (set to None) rather than zeroed, unless a caller asks for zeros. Each backward then hands
    its gradients over as they are computed instead of adding them into zeroed tensors, and
    update_hp_grads accumulates them into the fp32 (or bf16) gradients as before: one fill and
    one addition fewer over every weight per micro-batch."""
    type(optimizer).clear_lp_grads(optimizer, set_to_none=set_to_none)


def _replace_once(module, name: str, make) -> None:
    """`module.name = make(original)`, once per process: the function DeepSpeed's optimizer calls
    by that name in its own module; other callers of DeepSpeed's function keep it."""
    key = f"{module.__name__}.{name}"
    if key not in _PATCHED:
        setattr(module, name, make(getattr(module, name)))
        _PATCHED.add(key)


def _patch_norm_and_clip() -> None:
    """The norm and clipping functions BF16_Optimizer.step calls."""
    import deepspeed.runtime.bf16_optimizer as bf16

    def norm_of(original_norm):
        def global_norm(input_tensors, norm_type=2, mpu=None, moe_ep_group=None):
            tensors = list(input_tensors)
            if float(norm_type) != 2.0 or moe_ep_group is not None or not tensors:
                return original_norm(tensors, norm_type=norm_type, mpu=mpu,
                                     moe_ep_group=moe_ep_group)
            return l2_global_norm(tensors, mpu)
        return global_norm

    def clip(input_tensors, max_norm=1.0, global_norm=None, mpu=None, eps=1e-6):
        tensors = list(input_tensors)
        if global_norm is None:
            global_norm = bf16.get_global_norm_of_tensors(tensors, mpu=mpu)
        clip_coef = max_norm / (global_norm + eps)
        if tensors and clip_coef < 1:
            torch._foreach_mul_(tensors, clip_coef)
        return global_norm

    _replace_once(bf16, "get_global_norm_of_tensors", norm_of)
    _replace_once(bf16, "clip_tensors_by_global_norm", lambda original: clip)


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


@torch.no_grad()
def any_inf_or_nan(params) -> bool:
    """CheckOverflow.has_overflow_serial: whether any parameter's gradient holds inf or NaN,
    from one inf-norm over all of them (one host synchronisation, not one per parameter)."""
    grads = [p.grad for p in params if p.grad is not None and p.grad.numel()]
    if not grads:
        return False
    if any(g.is_sparse for g in grads):
        from deepspeed.runtime.utils import has_inf_or_nan

        return any(bool(has_inf_or_nan(g)) for g in grads)
    return bool(_not_finite(grads))


@torch.no_grad()
def unscale_and_clip_grads(optimizer, total_norm, apply_scale=True):
    """FP16_UnfusedOptimizer.unscale_and_clip_grads: the same combined scale, applied to the
    fp32 gradients with one `_foreach_mul_` per group."""
    combined_scale = optimizer.loss_scale_config.cur_scale
    if optimizer.clip_grad > 0.:
        clip = ((total_norm / optimizer.loss_scale_config.cur_scale) + 1e-6) / optimizer.clip_grad
        if clip > 1:
            combined_scale = clip * optimizer.loss_scale_config.cur_scale
    if apply_scale:
        for group in optimizer.fp32_groups:
            grads = [p.grad.data for p in group if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, 1. / combined_scale)
    return combined_scale


def _patch_weight_norm() -> None:
    """The get_weight_norm FP16_UnfusedOptimizer.step calls."""
    import deepspeed.runtime.fp16.unfused_optimizer as unfused

    def norm_of(original):
        def weight_norm(parameters, norm_type=2, mpu=None):
            tensors = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            if float(norm_type) != 2.0 or not tensors or any(t.is_sparse for t in tensors):
                return original(tensors, norm_type=norm_type, mpu=mpu)
            return l2_weight_norm(tensors, mpu)
        return weight_norm

    _replace_once(unfused, "get_weight_norm", norm_of)


def l2_weight_norm(tensors: list[torch.Tensor], mpu=None) -> float:
    """DeepSpeed's get_weight_norm for the L2 norm, as a float: each tensor's norm in fp32
    (replicated pipeline copies skipped, tensors not split over the tensor-parallel ranks counted
    on tensor rank 0), squared and added in order in fp32 as DeepSpeed adds them, all-reduced over
    mpu's model-parallel group, the square root taken; inf or NaN as -1."""
    import numpy as np
    from deepspeed import comm as dist
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.constants import PIPE_REPLICATED
    from deepspeed.runtime.utils import bwc_tensor_model_parallel_rank, is_model_parallel_parameter

    tp_rank = bwc_tensor_model_parallel_rank(mpu=mpu)
    counted = [t for t in tensors if not (hasattr(t, PIPE_REPLICATED) and t.ds_pipe_replicated)
               and (tp_rank == 0 or is_model_parallel_parameter(t))]
    total = np.float32(0.0)
    if counted:
        squares = torch.stack(torch._foreach_norm(counted, 2.0, dtype=torch.float32)).pow(2)
        for square in squares.cpu().numpy():  # one synchronisation; fp32 additions in order
            total = np.float32(total + square)
    total_device = get_accelerator().FloatTensor([float(total)])
    if mpu is not None:
        dist.all_reduce(total_device, op=dist.ReduceOp.SUM, group=mpu.get_model_parallel_group())
    norm = total_device[0].item() ** (1. / 2)
    return -1 if norm in (float("inf"), -float("inf")) or norm != norm else norm
