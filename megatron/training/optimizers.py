"""Torch optimizers by GPT-NeoX name, with no weight decay on biases and norm weights.

DeepSpeed's own Adam JIT-compiles a C++ op on first use; a torch optimizer passed to
`deepspeed.initialize` runs everywhere at once, so that is what every name maps to.

Each entry also declares the state tensors its optimizer keeps per parameter (Adam: the two
moments; SGD: the momentum buffer when momentum is set). Checkpoint resharding carries exactly
the declared tensors and refuses state it was not told about, so an optimizer added here must
declare its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # imported where an optimizer is built: `state_keys` serves deepy.py's memory
    import torch  # estimate, made before any worker starts, without torch


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices decay; biases, norm weights and other 1-D parameters do not, nor
    do parameters marked `_no_weight_decay` (GPT-NeoX's mark: Mamba's A_log and D)."""
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        exempt = param.dim() < 2 or getattr(param, "_no_weight_decay", False)
        (no_decay if exempt else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def split_groups(groups: list[dict], moved: Callable[[torch.nn.Parameter], bool],
                 **marks) -> list[dict]:
    """Each group's parameters for which `moved` holds put in a group of their own with the
    same settings plus `marks`, after the other groups (which keep their order)."""
    rest_groups, own_groups = [], []
    for group in groups:
        own = [p for p in group["params"] if moved(p)]
        rest = [p for p in group["params"] if not moved(p)]
        if rest:
            rest_groups.append({**group, "params": rest})
        if own:
            own_groups.append({**group, "params": own, **marks})
    return rest_groups + own_groups


def _fusable(groups) -> bool:
    """torch's fused Adam kernel takes float tensors on CPU and CUDA, one device for all."""
    tensors = [p for g in groups for p in g["params"]]
    devices = {p.device.type for p in tensors}
    return len(devices) == 1 and devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in tensors)


def _adamw(groups, params: dict) -> torch.optim.Optimizer:
    """Decoupled weight decay (AdamW), or with `adam_w_mode: false` (FusedAdam's switch) the
    decay added to the gradient (Adam with L2). The moments are the same tensors either way."""
    import torch

    # fused: one kernel for all parameters instead of a Python loop over them (torch only picks
    # a multi-tensor path by itself on CUDA)
    kind = torch.optim.AdamW if params.get("adam_w_mode", True) else torch.optim.Adam
    return kind(groups, lr=params.get("lr", 1e-3), betas=tuple(params.get("betas", (0.9, 0.999))),
                eps=params.get("eps", 1e-8), fused=_fusable(groups))


def _sgd(groups, params: dict) -> torch.optim.Optimizer:
    import torch

    return torch.optim.SGD(groups, lr=params.get("lr", 1e-3), momentum=params.get("momentum", 0.0),
                           dampening=params.get("dampening", 0.0),
                           nesterov=params.get("nesterov", False), foreach=True)


@dataclass(frozen=True)
class OptimizerSpec:
    """How to build one optimizer, and which state tensors it keeps per parameter."""

    build: Callable[[list, dict], torch.optim.Optimizer]
    state: Callable[[dict], tuple[str, ...]]  # optimizer params -> per-parameter state keys


_ADAM = OptimizerSpec(_adamw, lambda params: ("exp_avg", "exp_avg_sq"))
# GPT-NeoX's "Adam" with weight decay is DeepSpeed's FusedAdam in AdamW mode: decoupled decay.
OPTIMIZERS = {
    "adam": _ADAM,
    "adamw": _ADAM,
    "sgd": OptimizerSpec(_sgd, lambda params: ("momentum_buffer",)
                         if params.get("momentum", 0.0) else ()),
}


def _spec(optimizer_type: str) -> OptimizerSpec:
    key = optimizer_type.lower()
    if key not in OPTIMIZERS:
        raise ValueError(f"optimizer type {optimizer_type!r} is not supported; valid: "
                         f"{', '.join(sorted(OPTIMIZERS))}")
    return OPTIMIZERS[key]


def build_optimizer(model: torch.nn.Module, optimizer_type: str, params: dict,
                    weight_decay: float, expert_group: str | None = None) -> torch.optim.Optimizer:
    """The torch optimizer for `optimizer: {type, params}`; an unknown type lists the valid ones.
    Parameters kept in fp32 under bf16/fp16 get groups of their own (fp32_params.py). With
    `expert_group` (expert parallelism), the expert weights get groups of their own, marked
    for DeepSpeed (megatron/training/expert_parallel.py)."""
    spec = _spec(optimizer_type)
    # parameters kept fp32 under bf16/fp16 (megatron/training/fp32_params.py)
    groups = split_groups(param_groups(model, weight_decay),
                          lambda p: getattr(p, "keep_fp32", False))
    if expert_group is not None:  # marked for DeepSpeed (megatron/training/expert_parallel.py)
        groups = split_groups(groups, lambda p: getattr(p, "expert_parallel", False), moe=True,
                              name=expert_group)
    return spec.build(groups, params)


def state_keys(optimizer_type: str, params: dict) -> tuple[str, ...]:
    """The state tensors the optimizer `optimizer: {type, params}` keeps per parameter."""
    return _spec(optimizer_type).state(dict(params))
