"""One optimizer step (all micro-batches of a global batch) and one evaluation step.

    loss = train_step(engine, micro_batches)             # the step's loss
    result = run_step(engine, micro_batches, train=True)  # loss and the objective's metrics

The loss is averaged over micro-batches and data-parallel ranks and is identical on all ranks;
so are the metrics of the engine's training objective (megatron.training.objectives): averaged
the same way, or summed over the step for counts (`Objective.summed_metrics`). Under the
pipeline engine the last stage computes them and every stage receives them. A training step
labels its phases for the profiler (megatron/monitoring/profiler.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.profiler import record_function

from megatron.model.moe import aux_loss_scale
from megatron.monitoring.logger import deepspeed_prints
from megatron.monitoring.profiler import BACKWARD, FORWARD, GET_BATCH, OPTIMIZER_STEP


class StepResult(NamedTuple):
    loss: float
    metrics: dict


def train_step(engine, micro_batches) -> float:
    """Forward/backward over gradient_accumulation_steps micro-batches, then one optimizer step.

    `micro_batches` is an iterator of (inputs, targets) as the objective prepares them.
    """
    return run_step(engine, micro_batches, train=True).loss


@torch.no_grad()
def eval_step(engine, micro_batches) -> float:
    """The loss over one global batch without updating anything."""
    return run_step(engine, micro_batches, train=False).loss


def run_step(engine, micro_batches, train: bool) -> StepResult:
    """A training (`train`) or evaluation step: its loss and metrics."""
    steps = engine.engine.gradient_accumulation_steps()
    # MoE layers' auxiliary losses take the gradient scale the training loss gets
    with aux_loss_scale(loss_gradient_scale(engine.engine) / steps):
        return _run_step(engine, micro_batches, train, steps)


def loss_gradient_scale(ds) -> float:
    """The factor DeepSpeed (or `scale_loss_gradient`) multiplies the loss's gradient by before
    dividing by the accumulation steps: the fp16 loss scale, else 1."""
    config = getattr(ds.optimizer, "loss_scale_config", None)  # fp16/bf16 wrappers without ZeRO
    if config is not None:
        return float(config.cur_scale) if getattr(config, "use_grad_scaling", False) else 1.0
    scaler = getattr(ds.optimizer, "loss_scaler", None)  # ZeRO's (1.0 unless fp16)
    return float(scaler.cur_scale) if scaler is not None else 1.0


def _run_step(engine, micro_batches, train: bool, steps: int) -> StepResult:
    ds, objective = engine.engine, engine.objective
    if engine.is_pipeline:
        objective_loss = ds.module.loss_fn
        objective_loss.collected.clear()
        with deepspeed_prints():
            if train:
                loss = ds.train_batch(data_iter=micro_batches).item()
            else:
                with torch.no_grad():
                    loss = ds.eval_batch(data_iter=micro_batches).item()
        values = _pipeline_metrics(engine, objective_loss.collected, steps)
        return StepResult(loss, _dp_reduce(values, objective, engine, steps))
    device = ds.device or torch.device("cpu")  # DeepSpeed leaves it None on CPU without a rank
    total = torch.zeros((), device=device)  # summed where the loss is: no sync per micro-batch
    sums = torch.zeros(len(objective.metric_names), device=device)
    if not train:
        ds.eval()
    for _ in range(steps):
        with record_function(GET_BATCH):
            inputs, targets = on_device(next(micro_batches), device)
        with record_function(FORWARD), torch.set_grad_enabled(train):
            loss, metrics = objective.loss(ds(*inputs), targets)
        if train:
            scale_loss_gradient(loss, engine.loss_scale)
            with record_function(BACKWARD):
                ds.backward(loss)
            with record_function(OPTIMIZER_STEP):
                ds.step()
        total += loss.detach().float()
        if objective.metric_names:
            sums += _vector(metrics, objective)
    if not train:
        ds.train()
    values = torch.cat([(total / steps).reshape(1).cpu(), _per_step(sums.cpu(), objective, steps)])
    reduced = _dp_reduce(values, objective, engine, steps, with_loss=True)
    return StepResult(reduced.pop("__loss__"), reduced)


def on_device(batch, device: torch.device):
    """A micro-batch (nested tuples of tensors, None allowed) with its tensors on `device`; the
    pipeline engine moves its own, the plain engine does not."""
    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(on_device(item, device) for item in batch)
    return batch


def scale_loss_gradient(loss: torch.Tensor, scale) -> None:
    """Multiply the gradient leaving `loss` by `scale()` (the fp16 loss scale DeepSpeed leaves
    to us, engine.unapplied_loss_scale) when it is set and the loss will be back-propagated;
    the loss value itself, which is logged, stays unscaled."""
    if scale is not None and loss.requires_grad:
        factor = scale()
        loss.register_hook(lambda grad: grad * factor)


class ObjectiveLoss:
    """The pipeline's loss_fn: the objective's loss on the last stage, its metrics kept for
    `run_step` (one entry per micro-batch)."""

    def __init__(self, objective):
        self.objective = objective
        self.collected: list[torch.Tensor] = []
        self.loss_scale = None  # set by engine.build_engine where DeepSpeed does not apply it
        self.__name__ = f"{objective.name}_loss"

    def __call__(self, output, targets):
        loss, metrics = self.objective.loss(output, targets)
        self.collected.append(_vector(metrics, self.objective))
        scale_loss_gradient(loss, self.loss_scale)
        return loss


def _vector(metrics: dict, objective) -> torch.Tensor:
    return torch.stack([metrics[n].detach().float().reshape(()) for n in objective.metric_names]) \
        if objective.metric_names else torch.zeros(0)


def _per_step(sums: torch.Tensor, objective, steps: int) -> torch.Tensor:
    """Micro-batch sums to the step's values: means, or sums for counts."""
    scale = torch.tensor([1.0 if n in objective.summed_metrics else 1.0 / steps
                          for n in objective.metric_names])
    return sums * scale


def _pipeline_metrics(engine, collected: list, steps: int) -> torch.Tensor:
    """The last stage's metrics of the step, on every stage of the pipeline."""
    objective = engine.objective
    n = len(objective.metric_names)
    values = torch.zeros(n)
    if collected:
        values = _per_step(torch.stack(collected).sum(0).cpu(), objective, steps)
    if n:
        dist.all_reduce(values, group=engine.groups.pp_group)  # only the last stage has any
    return values


def _dp_reduce(values: torch.Tensor, objective, engine, steps: int,
               with_loss: bool = False) -> dict:
    """Average over the data-parallel group (summed metrics: add up); {name: float}."""
    names = (["__loss__"] if with_loss else []) + list(objective.metric_names)
    if not names:
        return {}
    group = engine.groups.dp_group
    size = dist.get_world_size(group=group)
    values = values.detach().float().clone()
    if size > 1:
        dist.all_reduce(values, group=group)
        mean = torch.tensor([0.0 if n in objective.summed_metrics else 1.0 for n in names])
        values = values * (mean / size + (1 - mean))
    return dict(zip(names, values.tolist()))
