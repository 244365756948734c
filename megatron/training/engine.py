"""The one place that calls `deepspeed.initialize`: model, optimizer, LR schedule, DS config."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from megatron.checkpointing.run import RunDescription
from megatron.host import check_precision_supported, cuda_available
from megatron.model.compile import check_supported as check_compile_supported
from megatron.model.compile import compile_layers
from megatron.model.compile import describe as describe_compiled
from megatron.model.config import ModelConfig
from megatron.model.fusions import cross_entropy_path, fusion_paths
from megatron.model.gpt import GPTModel, build_pipeline_model
from megatron.model.mamba_paths import describe as describe_mamba
from megatron.model.moe import describe as describe_moe
from megatron.model.precision import kept_in_fp32
from megatron.model.recompute import (Recompute, configure_activation_checkpointing,
                                      idle_checkpointing_options)
from megatron.monitoring.logger import (deepspeed_prints, deepspeed_warnings_hidden, get_logger,
                                       hide_foreign_deprecations)
from megatron.mpu.deepspeed_adapter import DeepSpeedMPU
from megatron.mpu.groups import ProcessGroups, TensorParallel
from megatron.mpu.initialize import disable_deepspeed_shm_allreduce
from megatron.mpu.layers import sync_sequence_parallel_grads
from megatron.mpu.products import describe as describe_products
from megatron.mpu.products import resolve as resolve_products
from megatron.mpu.topology import Topology
from megatron.training import expert_parallel
from megatron.training.optimizer_loops import fuse as fuse_optimizer_loops
from megatron.training.fp32_params import fp32_through_engine_cast
from megatron.training.learning_rates import AnnealingLR, lr_schedule
from megatron.training.objectives import Objective, build_objective
from megatron.training.optimizers import build_optimizer, state_keys
from megatron.training.step import ObjectiveLoss

log = get_logger(__name__)

# DeepSpeed's warnings about gradient accumulation, which a step of one micro-batch does not do
NO_ACCUMULATION_WARNINGS = (r"BF16 gradient accumulation is not safe",)


@dataclass
class Engine:
    """The DeepSpeed engine and what the loop needs to know about it."""

    engine: object  # deepspeed.DeepSpeedEngine or PipelineEngine
    is_pipeline: bool
    groups: ProcessGroups
    tp: TensorParallel
    run: RunDescription  # what checkpoint save / load know of the run
    model_config: ModelConfig  # as the model was built (cpu_matmul_precision: auto resolved)
    objective: Objective = None  # train_impl's loss and metrics (megatron.training.objectives)
    # the fp16 loss scale DeepSpeed leaves for us to apply (see `unapplied_loss_scale`)
    loss_scale: Callable[[], float] | None = None

    @property
    def topology(self) -> Topology:
        return self.groups.topology

    @property
    def lr_scheduler(self) -> AnnealingLR:
        return self.engine.lr_scheduler


def build_model(args, model_config: ModelConfig, topology: Topology, tp: TensorParallel,
                objective: Objective | None = None):
    """A PipelineModule when pipe_parallel_size >= 1 (its last stage computing `objective`'s
    loss), else the plain GPTModel."""
    par = args.parallelism
    recompute = Recompute(par.checkpoint_num_layers, tp) if par.checkpoint_activations else None
    if par.pipe_parallel_size >= 1:
        loss_fn = ObjectiveLoss(objective or build_objective(args, tp))
        with deepspeed_prints():  # its seed, topology and layer listing: debug lines
            return build_pipeline_model(model_config, topology.deepspeed_topology(),
                                        par.pipe_partition_method, recompute, tp, loss_fn)
    return GPTModel(model_config, tp, recompute)


def build_engine(args, model_config: ModelConfig, groups: ProcessGroups) -> Engine:
    """Build the model, a torch optimizer and the LR schedule, and hand them to DeepSpeed."""
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    from megatron.neox_arguments import deepspeed_config

    disable_deepspeed_shm_allreduce()
    hide_foreign_deprecations()
    check_precision_supported(args.derived.precision)
    check_compile_supported(args.model.torch_compile, args.derived.precision, cuda_available())
    tp = groups.tensor_parallel(args.training.seed, args.parallelism.sequence_parallel,
                                fp32_reduce=args.deepspeed.fp32_allreduce)
    for line in fusion_paths(args.model):
        log.info("%s", line)
    device = get_accelerator().device_name()
    if device == "cuda":
        log.info("%s", cross_entropy_path())
    ck = args.checkpoint
    products, why = resolve_products(
        model_config.cpu_matmul_precision, args.derived.precision, device,
        lambda: None if ck.finetune else recorded_products(ck.load, ck.iteration))
    model_config = replace(model_config, cpu_matmul_precision=products)
    cpu_products = None
    if args.derived.precision != "fp32" and device == "cpu":
        log.info("%s", describe_products(products, why))
        cpu_products = products
    if model_config.moe_num_experts > 1:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.derived.precision,
                                                                    torch.float32)
        log.info("%s", describe_moe(model_config, dtype, "cpu" if device == "cpu" else "cuda"))
    if model_config.has_mamba:
        log.info("%s", describe_mamba(model_config, "cpu" if device == "cpu" else "cuda"))
    for line in idle_checkpointing_options(args.parallelism):
        log.info("%s", line)
    if args.parallelism.checkpoint_activations:
        configure_activation_checkpointing(args.parallelism, model_config.num_layers,
                                           DeepSpeedMPU(groups))
    objective = build_objective(args, tp)
    model = build_model(args, model_config, groups.topology, tp, objective)
    hooked = sync_sequence_parallel_grads(model, tp)
    if hooked:
        log.info("sequence parallelism: %d parameters all-reduce their gradients over tp", hooked)
    if args.model.torch_compile:
        log.info("%s", describe_compiled(*compile_layers(model)))
    expert_group = None
    if tp.ep.enabled:
        expert_group = expert_parallel.prepare(model, groups, model_config.moe_num_experts)
        log.info("expert parallelism: %d experts per MoE layer on each of %d ranks exchanging "
                 "tokens (moe_expert_parallel_size %d; model_parallel_size %d)",
                 model_config.moe_num_experts // (tp.size * tp.ep.size), tp.ep.size, tp.ep.size,
                 tp.size)
    optimizer = build_optimizer(model, args.optimizer.optimizer["type"],
                                args.optimizer.optimizer.get("params", {}), args.optimizer.weight_decay,
                                expert_group)
    schedule = lr_schedule(args)
    kept = len(kept_in_fp32(model))
    if kept and args.derived.precision != "fp32":
        log.info("mamba_selective_fp32_params: %d Mamba parameters (A_log, D) stay fp32 in this "
                 "%s run, in optimizer groups of their own", kept, args.derived.precision)
    # deepspeed_prints: its bf16 optimizer prints memory usage 6 times, as debug lines.
    # DeepSpeed warns that bf16 gradients accumulate in bf16 whenever a pipeline engine runs
    # bf16; with one micro-batch per step nothing accumulates, and the warning is noise.
    hidden = (NO_ACCUMULATION_WARNINGS if args.derived.gradient_accumulation_steps == 1 else ())
    with deepspeed_prints(), deepspeed_warnings_hidden(hidden), fp32_through_engine_cast(model):
        engine, _, _, _ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=lambda opt: AnnealingLR(
                opt, schedule, use_checkpoint=args.lr_schedule.use_checkpoint_lr_scheduler,
                override=args.lr_schedule.override_lr_scheduler),
            model_parameters=None,
            config=deepspeed_config(args),
            # a PipelineModule brings its own grid; a plain module needs our groups
            mpu=None if args.parallelism.pipe_parallel_size >= 1 else DeepSpeedMPU(groups),
            dist_init_required=False,
        )
    fuse_optimizer_loops(engine.optimizer)
    _record_fp32_grad_norm(engine, tp.ep.group if tp.ep.enabled else None)
    _skip_nonfinite_steps(engine)
    _skip_reduction_over_one_replica(engine)
    loss_scale = unapplied_loss_scale(engine.optimizer)
    is_pipeline = args.parallelism.pipe_parallel_size >= 1
    if is_pipeline:
        # the last element of the stage tuple is a bool mask: DeepSpeed must not expect its grad
        engine.set_has_attention_mask(True)
        engine.module.loss_fn.loss_scale = loss_scale
    return Engine(engine=engine, is_pipeline=is_pipeline, groups=groups, tp=tp,
                  run=replace(checkpoint_run(args), cpu_products=cpu_products),
                  model_config=model_config, objective=objective, loss_scale=loss_scale)


def recorded_products(load: str | None, iteration: int | None) -> tuple[str, str] | None:
    """(setting, why) of the bf16/fp16 CPU products the checkpoint a run loads first was
    trained with (its manifest's cpu_matmul_precision), which `auto` keeps; None without one."""
    from pathlib import Path

    from megatron.checkpointing.locate import planned_manifest

    manifest = planned_manifest(Path(load), iteration) if load else None
    setting = manifest.run.get("cpu_matmul_precision") if manifest else None
    if setting not in ("fp32", "native"):
        return None
    return setting, f"as {Path(load) / manifest.tag} was trained, so that the run continues it"


def unapplied_loss_scale(optimizer) -> Callable[[], float] | None:
    """The current fp16 loss scale, where DeepSpeed does not apply it itself; else None.

    DeepSpeed 0.19 multiplies the loss by the scale in `engine.backward` for its ZeRO optimizers
    only. Its fp16 wrapper without ZeRO (FP16_Optimizer / FP16_UnfusedOptimizer: fp16 at ZeRO
    stage 0, or bf16 on a plain module, which needs no scaling) still divides the gradients by
    the scale before the step and looks for overflow in them: left alone, every fp16 update
    would be the loss scale times too small, no overflow would ever be seen, and gradients
    below fp16's range would vanish. The training step applies the scale to the gradient
    flowing out of the loss instead (`step.scale_loss_gradient`).
    """
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    config = getattr(optimizer, "loss_scale_config", None)
    if (optimizer is None or isinstance(optimizer, ZeROOptimizer) or config is None
            or not getattr(config, "use_grad_scaling", False)
            or getattr(optimizer, "custom_loss_scaler", False)):
        return None
    return lambda: float(config.cur_scale)


def checkpoint_run(args) -> RunDescription:
    """The run as checkpoint save and load see it (megatron/checkpointing/run.py)."""
    opt = args.optimizer.optimizer
    return RunDescription.from_args(args, state_keys(opt["type"], opt.get("params", {})))


def _record_fp32_grad_norm(engine, ep_group=None) -> None:
    """Replace DeepSpeed's fp32 clipping, which discards the norm and, with pipeline stages,
    counts only the first stage's replicated parameters, by `clip_grad_norm`.

    With ZeRO or bf16/fp16, DeepSpeed's optimizer wrapper computes and records the norm itself.
    A finite norm also tells the step that follows that every gradient is finite
    (`_finite_by_norm`, read once by _skip_nonfinite_steps): the norm counts each gradient
    element of the model-parallel group and is all-reduced over it, and data-parallel replicas
    hold the same averaged gradients, so no second pass over them is needed.
    """
    import math

    def clip_and_record() -> None:
        norm = clip_grad_norm(engine.module.parameters(), engine.gradient_clipping(), engine.mpu,
                              ep_group)
        engine._global_grad_norm = norm
        engine._finite_by_norm = math.isfinite(norm)

    engine.clip_fp32_gradients = clip_and_record


def _skip_nonfinite_steps(engine) -> None:
    """DeepSpeed's overflow rule for the plain torch optimizer (fp32 without ZeRO): a step
    whose gradients hold inf or NaN on any rank is not applied, and the engine counts it in
    skipped_steps and leaves the LR schedule where it is. DeepSpeed's ZeRO, bf16 and fp16
    optimizers (those with an `overflow` flag) skip such steps themselves."""
    import torch
    import torch.distributed as dist

    from megatron.safety.guard import all_finite

    optimizer = engine.optimizer
    if optimizer is None or hasattr(optimizer, "overflow"):
        return
    step = optimizer.step

    def checked_step(*args, **kwargs):
        # the clipping pass just before found a finite global norm: every gradient is finite
        # (a non-finite norm may be an overflow of finite squares: checked element-wise)
        known, engine._finite_by_norm = getattr(engine, "_finite_by_norm", False), False
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        bad = torch.zeros(1)
        if grads and not known:  # (the flag moves to the CPU, where gloo reduces it)
            bad[0] = float(not all_finite(grads))
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # every rank steps, or none
        optimizer.overflow = bool(bad.item())
        return None if optimizer.overflow else step(*args, **kwargs)

    optimizer.overflow = False
    optimizer.step = checked_step


def _skip_reduction_over_one_replica(engine) -> None:
    """With one data-parallel replica DeepSpeed still copies every gradient into a flat bucket,
    all-reduces it over a group of one, divides by 1 and copies it back: a pass over all
    gradients twice each step for nothing. Skip that when the reduction is the identity (a group
    of one, no pre-division, no DeepSpeed sequence parallelism)."""
    import torch.distributed as dist

    group = (engine.mpu.get_data_parallel_group() if engine.pipeline_parallelism
             else engine.seq_data_parallel_group)
    if (dist.get_world_size(group) != 1 or engine.gradient_predivide_factor() != 1.0
            or getattr(engine, "sequence_parallel_size", 1) != 1):
        return
    engine._reduce_non_expert_gradients = lambda grads, elements_per_buffer: None


def clip_grad_norm(parameters, max_norm: float, mpu, ep_group=None) -> float:
    """Scale gradients so their global L2 norm is at most `max_norm`; returns the norm before.

    Each gradient element counts once over the model-parallel group: tensor-parallel shards
    (`tensor_model_parallel`) on every rank, replicated parameters on tensor rank 0 only, and a
    tied weight only on the pipeline stage that owns it (DeepSpeed flags the copies
    `ds_pipe_replicated`). Data-parallel ranks hold identical averaged gradients already, but
    for the experts under expert parallelism: each rank of `ep_group` counts its own.
    """
    import torch
    import torch.distributed as dist
    from deepspeed.utils.bwc import bwc_tensor_model_parallel_rank

    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    tp_rank = bwc_tensor_model_parallel_rank(mpu=mpu) if mpu is not None else 0
    counted = [p.grad.detach() for p in params
               if not getattr(p, "ds_pipe_replicated", False)
               and not (ep_group is not None and getattr(p, "expert_parallel", False))
               and (tp_rank == 0 or getattr(p, "tensor_model_parallel", False))]
    total = torch.zeros((), dtype=torch.float64, device=params[0].grad.device)
    if counted:
        # one fused pass over all gradients; squares summed in fp64
        total += torch.stack(torch._foreach_norm(counted)).double().pow(2).sum()
    if ep_group is not None:
        total += expert_parallel.expert_norm_squared(params, ep_group).to(total.device)
    if mpu is not None:
        dist.all_reduce(total, group=mpu.get_model_parallel_group())
    norm = float(total.sqrt())
    if max_norm > 0 and norm > max_norm:
        torch._foreach_mul_([p.grad.detach() for p in params], max_norm / (norm + 1e-6))
    return norm
