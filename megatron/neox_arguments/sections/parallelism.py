"""The parallelism section: tensor / pipeline degrees, activation checkpointing, backend."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option


@dataclass(frozen=True)
class ParallelismArgs:
    """How the model is split over ranks; the data-parallel degree follows from the world size."""

    pipe_parallel_size: int = option(
        0,
        "Pipeline stages; 0 runs without DeepSpeed's pipeline engine, 1 uses it with one stage.",
    )
    model_parallel_size: int = option(
        1, "Tensor-parallel degree: ranks that split each layer's weights."
    )
    moe_expert_parallel_size: int = option(
        1,
        "Expert parallelism: MoE layers' experts are split over this many data-parallel ranks, "
        "which exchange tokens by all-to-all (it must divide the data-parallel size, and "
        "moe_num_experts / model_parallel_size must divide by it).",
    )
    sequence_parallel: bool = option(
        False,
        "Shard norm and dropout activations along the sequence over the tensor-parallel ranks "
        "(no effect when model_parallel_size is 1).",
    )
    pipe_partition_method: str = option(
        "type:transformer|mlp",
        "How layers are spread over pipeline stages: parameters (balance parameter counts), "
        "uniform (balance layer counts) or type:<regex> (balance layers whose class matches).",
    )
    checkpoint_activations: bool = option(
        False,
        "Recompute transformer layers in the backward pass instead of storing their "
        "activations, through deepspeed.checkpointing (dropout replays the same masks).",
    )
    checkpoint_num_layers: int = option(
        1,
        "Transformer layers recomputed together per checkpoint (with pipeline stages, "
        "consecutive layers of a stage; a group holding the embedding, final norm or head is "
        "not checkpointed).",
    )
    partition_activations: bool = option(
        False,
        "Split each stored checkpoint over the tensor-parallel ranks (gathered again in "
        "backward); needs checkpoint_activations; with model_parallel_size 1 it keeps "
        "checkpoints whole and says so.",
    )
    contiguous_checkpointing: bool = option(
        False,
        "Copy partitioned checkpoints into preallocated contiguous buffers (less "
        "fragmentation); needs checkpoint_activations and partition_activations.",
    )
    checkpoint_in_cpu: bool = option(
        False,
        "Keep stored checkpoints in CPU memory; needs checkpoint_activations (on a CPU run they "
        "are there already, which the log says).",
    )
    synchronize_each_layer: bool = option(
        False,
        "Synchronize the device at the start and end of each checkpoint's forward and "
        "backward; needs checkpoint_activations (nothing to wait for on CPU, which the log "
        "says).",
    )
    distributed_backend: str = option(
        "auto",
        "torch.distributed backend: auto (nccl on CUDA, gloo on CPU), nccl or gloo.",
    )
