"""The one place that calls `deepspeed.initialize`: model, optimizer, LR schedule, DS config."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel, build_pipeline_model
from megatron.monitoring.logger import get_logger
from megatron.mpu.topology import Topology
from megatron.training.learning_rates import AnnealingLR, Schedule
from megatron.training.optimizers import build_optimizer

log = get_logger(__name__)


@dataclass
class Engine:
    """The DeepSpeed engine and what the loop needs to know about it."""

    engine: object  # deepspeed.DeepSpeedEngine or PipelineEngine
    is_pipeline: bool
    topology: Topology

    @property
    def lr_scheduler(self) -> AnnealingLR:
        return self.engine.lr_scheduler


def lr_schedule(args) -> Schedule:
    """The schedule constants from the run config."""
    return Schedule(lr=args.optimizer.lr, min_lr=args.lr_schedule.min_lr,
                    warmup_iters=args.derived.warmup_iters, decay_iters=args.derived.lr_decay_iters,
                    style=args.lr_schedule.lr_decay_style)


def build_model(args, model_config: ModelConfig, topology: Topology):
    """A PipelineModule when pipe_parallel_size >= 1, else the plain GPTModel."""
    par = args.parallelism
    if par.pipe_parallel_size >= 1:
        interval = par.checkpoint_num_layers if par.checkpoint_activations else 0
        return build_pipeline_model(model_config, topology.deepspeed_topology(),
                                    par.pipe_partition_method, interval)
    return GPTModel(model_config, checkpoint_activations=par.checkpoint_activations)


def build_engine(args, model_config: ModelConfig, topology: Topology) -> Engine:
    """Build the model, a torch optimizer and the LR schedule, and hand them to DeepSpeed."""
    import deepspeed
    import torch

    from megatron.neox_arguments import deepspeed_config

    if args.derived.precision == "fp16" and not torch.cuda.is_available():
        raise ValueError("fp16 training needs a CUDA GPU: DeepSpeed's CPU accelerator has no fp16 "
                         "support. On CPU use bf16 ('bf16: {enabled: true}', fast on CPUs with "
                         "AMX) or fp32 (remove the fp16 section)")
    model = build_model(args, model_config, topology)
    optimizer = build_optimizer(model, args.optimizer.optimizer["type"],
                                args.optimizer.optimizer.get("params", {}), args.optimizer.weight_decay)
    schedule = lr_schedule(args)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        lr_scheduler=lambda opt: AnnealingLR(opt, schedule),
        model_parameters=None,
        config=deepspeed_config(args),
        dist_init_required=False,
    )
    _record_fp32_grad_norm(engine)
    is_pipeline = args.parallelism.pipe_parallel_size >= 1
    if is_pipeline:
        # the last element of the stage tuple is a bool mask: DeepSpeed must not expect its grad
        engine.set_has_attention_mask(True)
    return Engine(engine=engine, is_pipeline=is_pipeline, topology=topology)


def _record_fp32_grad_norm(engine) -> None:
    """Keep the norm DeepSpeed's fp32 clipping computes (it discards it) for logging.

    With ZeRO or bf16/fp16, DeepSpeed's optimizer wrapper records the norm itself.
    """
    from deepspeed.runtime.utils import clip_grad_norm_

    def clip_and_record() -> None:
        engine._global_grad_norm = clip_grad_norm_(parameters=engine.module.parameters(),
                                                   max_norm=engine.gradient_clipping(), mpu=engine.mpu)

    engine.clip_fp32_gradients = clip_and_record
