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
        False, "Recompute layer activations in the backward pass instead of storing them."
    )
    checkpoint_num_layers: int = option(
        1, "Number of layers recomputed together per activation checkpoint."
    )
    partition_activations: bool = option(
        False, "Split checkpointed activations across tensor-parallel ranks."
    )
    contiguous_checkpointing: bool = option(
        False, "Copy checkpointed activations into one contiguous buffer."
    )
    checkpoint_in_cpu: bool = option(False, "Keep checkpointed activations in CPU memory.")
    synchronize_each_layer: bool = option(
        False, "Synchronize the device at the start and end of each checkpointed layer."
    )
    distributed_backend: str = option(
        "auto",
        "torch.distributed backend: auto (nccl on CUDA, gloo on CPU), nccl or gloo.",
    )
