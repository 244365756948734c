"""Activation checkpointing: DeepSpeed's `checkpointing.checkpoint`, configured from the run, with
the tensor-parallel RNG stream replayed when a group of layers is recomputed.

`configure_activation_checkpointing(par, num_layers, mpu)` hands the parallelism section's keys
to `deepspeed.checkpointing.configure` (as GPT-NeoX does): partition_activations,
contiguous_checkpointing, checkpoint_in_cpu, synchronize_each_layer, and the number of
checkpoints a forward pass stores (num_layers / checkpoint_num_layers, rounded up).

`Recompute` is the checkpoint function both model paths call: `GPTModel` on each group of
`checkpoint_num_layers` transformer layers, DeepSpeed's `PipelineModule` on each group of
`activation_checkpoint_interval` layers. DeepSpeed saves and restores torch's default (CPU) and
accelerator generators around the recompute; the per-rank stream that dropout in split regions
draws from (`TensorParallelRNG`, megatron/mpu/random.py) is ours, so `Recompute` rewinds it to
where the forward pass found it, and after the recompute puts it back where it had got to.
"""

from __future__ import annotations

from megatron.monitoring.logger import get_logger
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.neox_arguments.derived import activation_checkpoints

log = get_logger(__name__)


def checkpointing_notes(par, num_layers: int, tp_size: int, on_cuda: bool) -> list[str]:
    """What activation checkpointing does in this run: one summary line, then a line for each
    option that has nothing to act on here (so it is never silently a no-op)."""
    notes = [f"activation checkpointing: {par.checkpoint_num_layers} layer(s) per checkpoint, "
             f"{activation_checkpoints(num_layers, par.checkpoint_num_layers)} checkpoints per "
             "forward pass, recomputed through deepspeed.checkpointing"]
    if par.partition_activations and tp_size == 1:
        notes.append("partition_activations: model_parallel_size is 1, so each checkpoint is "
                     "kept whole (there is no other tensor-parallel rank to hold a part)")
    if par.checkpoint_in_cpu and not on_cuda:
        notes.append("checkpoint_in_cpu: the run is on CPU, so checkpoints are in CPU memory "
                     "already; nothing is moved")
    if par.synchronize_each_layer and not on_cuda:
        notes.append("synchronize_each_layer: CPU operations complete before they return; the "
                     "synchronisation at each checkpoint boundary waits for nothing")
    return notes


# DeepSpeed's activation-checkpointing options: they act only on checkpointed activations
CHECKPOINTING_OPTIONS = ("partition_activations", "contiguous_checkpointing", "checkpoint_in_cpu",
                         "synchronize_each_layer")


def idle_checkpointing_options(par) -> list[str]:
    """A line for each checkpointing option set while checkpoint_activations is false: it has
    nothing to act on, as in GPT-NeoX, which accepts it the same way."""
    if par.checkpoint_activations:
        return []
    return [f"{key} is true but checkpoint_activations is false: nothing is checkpointed, so it "
            "changes nothing in this run (set checkpoint_activations: true for it to act)"
            for key in CHECKPOINTING_OPTIONS if getattr(par, key)]


def configure_activation_checkpointing(par, num_layers: int, mpu) -> None:
    """Configure DeepSpeed's activation checkpointing from the parallelism section `par`;
    `mpu` answers the tensor-parallel rank, size and group partitioned activations use."""
    import torch
    from deepspeed.runtime.activation_checkpointing import checkpointing

    for note in checkpointing_notes(par, num_layers, mpu.get_model_parallel_world_size(),
                                    torch.cuda.is_available()):
        log.info("%s", note)

    checkpointing.configure(
        mpu,
        partition_activations=par.partition_activations,
        contiguous_checkpointing=par.contiguous_checkpointing,
        num_checkpoints=activation_checkpoints(num_layers, par.checkpoint_num_layers,
                                               par.pipe_parallel_size),
        checkpoint_in_cpu=par.checkpoint_in_cpu,
        synchronize=par.synchronize_each_layer,
    )


class _ReplayRNG:
    """`function` whose second call (the recompute in backward) sees the tensor-parallel RNG
    stream as the first call (the forward pass) found it."""

    def __init__(self, function, rng):
        self.function = function
        self.rng = rng
        self.at_forward = rng.state_dict()
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        if self.calls == 1:
            return self.function(*args)
        advanced = self.rng.state_dict()
        self.rng.load_state_dict(self.at_forward)
        try:
            return self.function(*args)
        finally:
            self.rng.load_state_dict(advanced)


class Recompute:
    """The activation checkpoint function: `recompute(function, *inputs)` runs `function`
    without keeping its activations and runs it again in backward.

    `num_layers` is checkpoint_num_layers (transformer layers per checkpoint); `tp` the
    tensor-parallel view whose RNG stream dropout in split regions draws from.
    """

    def __init__(self, num_layers: int = 1, tp: TensorParallel = NO_TP):
        if num_layers < 1:
            raise ValueError(f"checkpoint_num_layers({num_layers}) must be at least 1")
        self.num_layers = num_layers
        self.rng = tp.rng if tp.enabled else None

    def __call__(self, function, *inputs):
        from deepspeed.runtime.activation_checkpointing import checkpointing

        if self.rng is not None:
            function = _ReplayRNG(function, self.rng)
        return checkpointing.checkpoint(function, *inputs)
