"""Per-parameter gradient norms (`log_grad_norm`), read just before the optimizer step.

GPT-NeoX logs `gradient_norms/<parameter name>` from gradients its DeepSpeed fork copies out at
every step, which works only without pipeline parallelism. Here a `GradNormProbe` reads them on
the iterations that are logged only, on any layout, under canonical names
(`<layer index>.<parameter path>`, see megatron/model/partition.py):

- each rank squares the part of each gradient it holds: the whole gradient (ZeRO 0, fp32 or
  fp16), or its fragment of the optimizer's fp32 gradient partition (ZeRO 1-3, the bf16
  optimizer), summed over the data-parallel group with one all-reduce;
- tensor-parallel shards are summed over the tensor-parallel group; replicated parameters
  count once, and a tied weight only on the pipeline stage that owns it;
- pipeline stages send their norms to global rank 0 (one gather, only with several stages).

The norms are those of the unclipped gradient that `grad_norm` reports (fp16 loss scaling
removed), so their squares add up to `grad_norm` squared.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.checkpointing.optimizer_layouts import held_gradient
from megatron.model.partition import canonical_param_name

TAG = "gradient_norms/"  # GPT-NeoX's tag prefix


class GradNormProbe:
    """Reads every parameter's gradient norm at the next optimizer step after `arm()`."""

    def __init__(self, engine):
        self._engine = engine
        self._armed = False
        self._norms: dict[str, float] = {}
        ds = engine.engine
        step = ds._take_model_step  # both DeepSpeed engines run the optimizer step through it

        def take_model_step(*args, **kwargs):
            if self._armed:
                self._armed = False
                self._norms = parameter_grad_norms(engine)
            return step(*args, **kwargs)

        ds._take_model_step = take_model_step

    def arm(self) -> None:
        """Read the norms at the next optimizer step (every rank must arm the same step)."""
        self._armed = True
        self._norms = {}

    def take(self) -> dict[str, float]:
        """`gradient_norms/<name>` -> norm of the armed step on global rank 0 ({} elsewhere)."""
        norms, self._norms = self._norms, {}
        return {TAG + name: value for name, value in norms.items()}


def _square(grad: torch.Tensor) -> torch.Tensor:
    return grad.detach().double().pow(2).sum()


def parameter_grad_norms(engine) -> dict[str, float]:
    """Canonical name -> gradient norm of every parameter, on global rank 0 ({} elsewhere).
    Collective over all ranks; call after the last backward and before the optimizer step."""
    ds = engine.engine
    names, squares, partitioned, split = [], [], [], []
    for name, param in ds.module.named_parameters():
        if getattr(param, "ds_pipe_replicated", False):
            continue  # a tied weight's copy: the owning stage reports it
        grad, part = held_gradient(param)
        if grad is None:
            continue
        names.append(canonical_param_name(name))
        squares.append(_square(grad))
        partitioned.append(part)
        split.append(bool(getattr(param, "tensor_model_parallel", False)))
    device = next(ds.module.parameters()).device
    values = (torch.stack([s.to(device) for s in squares]) if squares
              else torch.zeros(0, dtype=torch.float64, device=device))
    values = _sum_over(values, torch.tensor(partitioned, dtype=torch.bool, device=device),
                       engine.groups.dp_group)
    values = _sum_over(values, torch.tensor(split, dtype=torch.bool, device=device),
                       engine.groups.tp_group)
    scale = _loss_scale(ds)
    local = dict(zip(names, (v / scale for v in values.sqrt().tolist())))
    return _gather_stages(engine, local)


def _loss_scale(ds) -> float:
    """The factor fp16 gradients still carry before the optimizer step (1 without fp16)."""
    if not ds.fp16_enabled():
        return 1.0
    scale = ds._get_optimizer_loss_scale()
    return float(scale) if scale else 1.0


def _sum_over(values: torch.Tensor, mask: torch.Tensor, group) -> torch.Tensor:
    """`values` with the entries under `mask` summed over `group` (the others kept)."""
    if dist.get_world_size(group=group) == 1:
        return values
    summed = torch.where(mask, values, torch.zeros_like(values))
    dist.all_reduce(summed, group=group)
    return torch.where(mask, summed, values)


def _gather_stages(engine, local: dict[str, float]) -> dict[str, float]:
    """Every stage's norms on global rank 0, in layer order."""
    rank = dist.get_rank()
    topology = engine.topology
    coords = topology.coords(rank)
    if topology.pp == 1:
        return local if rank == 0 else {}
    if coords.data != 0 or coords.model != 0:
        return {}  # rank 0's pipeline group (data 0, model 0) holds every stage's values
    stages = [None] * topology.pp if rank == 0 else None
    dist.gather_object(local, stages, dst=0, group=engine.groups.pp_group)
    if rank != 0:
        return {}
    return {name: value for stage in stages for name, value in stage.items()}
