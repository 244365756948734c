"""One optimizer step (all micro-batches of a global batch) and one evaluation step.

Both return the loss averaged over micro-batches and data-parallel ranks, identical on all ranks.
A training step labels its phases for the profiler (megatron/monitoring/profiler.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.profiler import record_function

from megatron.model.gpt import lm_loss
from megatron.monitoring.logger import deepspeed_prints
from megatron.monitoring.profiler import BACKWARD, FORWARD, GET_BATCH, OPTIMIZER_STEP


def _dp_mean(value: torch.Tensor, engine) -> float:
    """Average a scalar over the data-parallel group (the pipeline engine already did)."""
    group = engine.groups.dp_group
    size = dist.get_world_size(group=group)
    value = value.detach().float().clone()
    if size > 1:
        dist.all_reduce(value, group=group)
        value /= size
    return value.item()


def train_step(engine, micro_batches) -> float:
    """Forward/backward over gradient_accumulation_steps micro-batches, then one optimizer step.

    `micro_batches` is an iterator of ((tokens, position_ids, mask), (labels, loss_mask)).
    """
    ds = engine.engine
    if engine.is_pipeline:
        with deepspeed_prints():
            return ds.train_batch(data_iter=micro_batches).item()
    total = torch.zeros(())
    steps = ds.gradient_accumulation_steps()
    for _ in range(steps):
        with record_function(GET_BATCH):
            inputs, targets = next(micro_batches)
        with record_function(FORWARD):
            loss = lm_loss(ds(*inputs), targets, engine.tp)
        with record_function(BACKWARD):
            ds.backward(loss)
        with record_function(OPTIMIZER_STEP):
            ds.step()
        total += loss.detach().float()
    return _dp_mean(total / steps, engine)


@torch.no_grad()
def eval_step(engine, micro_batches) -> float:
    """The loss over one global batch without updating anything."""
    ds = engine.engine
    if engine.is_pipeline:
        with deepspeed_prints():
            return ds.eval_batch(data_iter=micro_batches).item()
    ds.eval()
    total = torch.zeros(())
    steps = ds.gradient_accumulation_steps()
    for _ in range(steps):
        inputs, targets = next(micro_batches)
        total += lm_loss(ds(*inputs), targets, engine.tp).float()
    ds.train()
    return _dp_mean(total / steps, engine)
