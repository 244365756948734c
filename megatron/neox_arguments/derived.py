"""Values computed from what the user wrote: world and batch sizes, precision, MLP width, ...

Everything here is a pure function of config values (and the world size); `compute_derived`
gathers them into the frozen `Derived` held as `args.derived`, apart from the user's own fields.
Functions raise `ConfigError` only where the inputs admit no answer (an underdetermined batch
size, a malformed attention_config); the consistency rules themselves live in validate.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import ConfigError
from .registries import GATED_ACTIVATIONS


@dataclass(frozen=True)
class Derived:
    """Resolved values the run uses; read them as `args.derived.<name>` (or `args.<name>`)."""

    world_size: int
    num_nodes: int
    num_gpus: int
    data_parallel_size: int
    pipeline_stages: int
    is_pipe_parallel: bool
    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    precision: str
    lr_decay_iters: int
    warmup_iters: float
    attention_types: tuple[str, ...]
    intermediate_size: int
    mamba_inner_size: int
    num_kv_heads: int
    head_dim: int
    zero_stage: int
    save_iters: tuple[int, ...]
    text_gen_type: str
    output_dir: str
    sample_output_path: str


DERIVED_NAMES = frozenset(f.name for f in dataclasses.fields(Derived))


def output_dir(log_dir: str | None, load: str | None) -> str:
    """Where a run's generated outputs go when their keys are unset: log_dir, else load, else
    the current directory."""
    return log_dir or load or "."


def sample_output_path(sample_output_file: str | None, out_dir: str) -> str:
    """sample_output_file as given, else `<output_dir>/samples/samples.jsonl`."""
    return sample_output_file or f"{out_dir}/samples/samples.jsonl"


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= value."""
    return -(-value // multiple) * multiple


def padded_vocab_size(
    vocab_size: int, make_vocab_size_divisible_by: int, model_parallel_size: int
) -> int:
    """vocab_size rounded up to a multiple of make_vocab_size_divisible_by * model_parallel_size."""
    return round_up(vocab_size, make_vocab_size_divisible_by * model_parallel_size)


def resolve_num_nodes(num_nodes: int | None) -> int:
    """Nodes the world size assumes: -1 ("all of the hostfile") and null count as 1."""
    return 1 if num_nodes is None or num_nodes < 1 else num_nodes


def resolve_num_gpus(num_gpus: int | None) -> int:
    """Processes per node the world size assumes: null counts as 1."""
    return 1 if num_gpus is None else num_gpus


def resolve_world_size(c: Mapping[str, Any], world_size: int | None = None) -> int:
    """Ranks the derived values assume: `world_size` when the launcher gives it, else
    num_nodes * num_gpus (null and -1 count as 1).

    When num_gpus is null (not pinned) and that product cannot hold one model replica, the
    smallest world that can is assumed instead: num_nodes * model_parallel_size * pipeline
    stages. The launcher replaces it with the real size (`with_world_size`).
    """
    if world_size is not None:
        return world_size
    nodes = resolve_num_nodes(c["num_nodes"])
    world = nodes * resolve_num_gpus(c["num_gpus"])
    replica = c["model_parallel_size"] * pipeline_stages(c["pipe_parallel_size"])
    if c["num_gpus"] is None and replica >= 1 and world % replica:
        return nodes * replica
    return world


def pipeline_stages(pipe_parallel_size: int) -> int:
    """Pipeline degree used for rank maths: pipe_parallel_size 0 and 1 both mean one stage."""
    return max(pipe_parallel_size, 1)


def data_parallel_size(world_size: int, model_parallel_size: int, pipe_parallel_size: int) -> int:
    """Data-parallel replicas: world_size // (model_parallel_size * pipeline stages)."""
    return world_size // (model_parallel_size * pipeline_stages(pipe_parallel_size))


def resolve_batch_sizes(
    dp: int, train: int | None, micro: int | None, accum: int | None
) -> tuple[int, int, int]:
    """(train_batch_size, micro batch, grad accumulation) from any two of them (or train or micro
    alone, with accumulation 1); `ConfigError` when no whole-number answer exists."""
    rule = (
        "train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps"
        " * data_parallel_size"
    )
    if train is not None and micro is not None and accum is not None:
        pass
    elif train is not None and micro is not None:
        if train % (micro * dp):
            raise ConfigError(
                f"train_batch_size({train}) is not divisible by train_micro_batch_size_per_gpu"
                f"({micro}) * data_parallel_size({dp}) = {micro * dp}, so "
                f"gradient_accumulation_steps cannot be derived ({rule}); change one of them."
            )
        accum = train // (micro * dp)
    elif train is not None:
        accum = 1 if accum is None else accum
        if train % (accum * dp):
            raise ConfigError(
                f"train_batch_size({train}) is not divisible by gradient_accumulation_steps"
                f"({accum}) * data_parallel_size({dp}) = {accum * dp}, so "
                f"train_micro_batch_size_per_gpu cannot be derived ({rule}); change one of them."
            )
        micro = train // (accum * dp)
    elif micro is not None:
        accum = 1 if accum is None else accum
        train = micro * accum * dp
    else:
        raise ConfigError(
            "No batch size is set: give train_micro_batch_size_per_gpu (optionally with "
            "gradient_accumulation_steps), or train_batch_size."
        )
    return train, micro, accum


def resolve_precision(
    precision: str | None, fp16: Mapping[str, Any] | None, bf16: Mapping[str, Any] | None
) -> str:
    """"fp32", "fp16" or "bf16": the precision key if set, else the enabled fp16/bf16 section.

    As in GPT-NeoX, an enabled fp16 section with type "bfloat16" means bf16.
    """
    if precision is not None:
        return "bf16" if precision == "bfloat16" else precision
    modes = enabled_precision_modes(fp16, bf16)
    return modes[0] if modes else "fp32"


def enabled_precision_modes(
    fp16: Mapping[str, Any] | None, bf16: Mapping[str, Any] | None
) -> list[str]:
    """The modes the fp16 / bf16 sections switch on ("fp16", "bf16"), in that order."""
    modes = []
    if fp16 and fp16.get("enabled", False):
        modes.append("bf16" if fp16.get("type") == "bfloat16" else "fp16")
    if bf16 and bf16.get("enabled", False) and "bf16" not in modes:
        modes.append("bf16")
    return modes


def mamba_inner_size(hidden_size: int, intermediate_size: int | None) -> int:
    """Channels of a Mamba layer (d_inner): intermediate_size when set, else 2 * hidden_size
    (GPT-NeoX's rule, its expansion_factor unset)."""
    return intermediate_size if intermediate_size else 2 * hidden_size


def expand_attention_types(attention_config: list | None, num_layers: int) -> tuple[str, ...]:
    """One attention type per layer from GPT-NeoX's [[[types...], count], ...] form.

    null means "global" everywhere; a plain list of strings is taken as already expanded; a
    count of "all" repeats the pattern over every layer.
    """
    if attention_config is None:
        return ("global",) * num_layers
    if all(isinstance(item, str) for item in attention_config):
        return tuple(attention_config)
    types: list[str] = []
    for i, item in enumerate(attention_config):
        if not (
            isinstance(item, (list, tuple))
            and len(item) == 2
            and isinstance(item[0], (list, tuple))
            and all(isinstance(t, str) for t in item[0])
            and len(item[0]) > 0
            and (item[1] == "all" or (isinstance(item[1], int) and not isinstance(item[1], bool)))
        ):
            raise ConfigError(
                f"attention_config entry {i} is {item!r}; each entry must be [[type, ...], count], "
                f'e.g. [[["global"], {num_layers}]].'
            )
        pattern, count = list(item[0]), item[1]
        if count == "all":
            if num_layers % len(pattern):
                raise ConfigError(
                    f"attention_config entry {i} repeats {pattern} over all layers, but "
                    f"num_layers({num_layers}) is not a multiple of its length({len(pattern)})."
                )
            count = num_layers // len(pattern)
        types.extend(pattern * count)
    return tuple(types)


def mlp_width(
    hidden_size: int, intermediate_size: int | None, activation: str, mlp_multiple_of: int
) -> int:
    """Width of the MLP's hidden layer (the input of its down projection), GPT-NeoX's rule.

    The base size is intermediate_size, or 4 * hidden_size when null. A gated activation
    (geglu, swiglu, reglu) keeps the parameter count of an ungated MLP of the base size: its width
    is int(base * 2 / 3) // 2 (its up projection is twice as wide). The result is rounded up to
    a multiple of mlp_multiple_of; e.g. base 32768, swiglu, multiple 256 gives 11008.
    """
    base = intermediate_size if intermediate_size else 4 * hidden_size
    width = (base * 2 // 3) // 2 if activation in GATED_ACTIVATIONS else base
    return round_up(width, mlp_multiple_of)


def activation_checkpoints(num_layers: int, checkpoint_num_layers: int,
                           pipe_parallel_size: int = 0) -> int:
    """How many activation checkpoints a rank holds at most before a backward pass: one per
    group of checkpoint_num_layers layers, times the micro-batches a pipeline stage can have in
    flight (up to one per stage) with pipe_parallel_size > 1. DeepSpeed sizes
    contiguous_checkpointing's buffers by it."""
    return math.ceil(num_layers / checkpoint_num_layers) * max(1, pipe_parallel_size)


def decay_iterations(train_iters: int, lr_decay_iters: int | None,
                     lr_decay_fraction: float | None) -> int:
    """GPT-NeoX's decay length: lr_decay_iters, else floor(train_iters * lr_decay_fraction),
    else train_iters; at least 1."""
    if lr_decay_iters is not None:
        iters = lr_decay_iters
    elif lr_decay_fraction is not None:
        iters = math.floor(train_iters * lr_decay_fraction)
    else:
        iters = train_iters
    return max(1, iters)


def should_save(iteration: int, checkpoint_factor: float | None, checkpoint_scale: str,
                extra_save_iters) -> bool:
    """Whether a checkpoint is saved after `iteration`: the one save schedule, used by the
    training loop and by `save_iterations`. GPT-NeoX's `is_save_iter`: at `extra_save_iters`;
    every `checkpoint_factor` iterations (linear); or where iteration == int(factor**k) for
    some k >= 0 (log: factor 2 gives 1, 2, 4, 8, ...; factor 1.5 gives 1, 2, 3, 5, 7, 11, ...)."""
    if extra_save_iters and iteration in extra_save_iters:
        return True
    if not checkpoint_factor or iteration <= 0:
        return False
    if checkpoint_scale == "log":
        if checkpoint_factor <= 1:
            return False  # refused by validation; no power ever grows
        power = 1.0
        while power < iteration + 1:
            if int(power) == iteration:
                return True
            power *= checkpoint_factor
        return False
    return iteration % checkpoint_factor == 0


def save_iterations(
    train_iters: int,
    checkpoint_factor: float | None,
    checkpoint_scale: str,
    extra_save_iters: list[int] | None,
) -> tuple[int, ...]:
    """Iterations before train_iters at which `should_save` saves (the training loop saves the
    last iteration as well), plus every extra_save_iters entry."""
    candidates = set(extra_save_iters or ())
    if checkpoint_factor and checkpoint_scale == "log" and checkpoint_factor > 1:
        power = 1.0
        while power < train_iters:
            candidates.add(int(power))
            power *= checkpoint_factor
    elif checkpoint_factor:
        candidates.update(range(0, train_iters, max(1, int(checkpoint_factor))))
    extras = set(extra_save_iters or ())
    return tuple(sorted(i for i in candidates if i in extras or (
        i < train_iters and should_save(i, checkpoint_factor, checkpoint_scale, extras))))


def compute_derived(c: Mapping[str, Any], world_size: int | None = None) -> Derived:
    """All derived values from the flat config `c` (world size as `resolve_world_size`)."""
    nodes, gpus = resolve_num_nodes(c["num_nodes"]), resolve_num_gpus(c["num_gpus"])
    world = resolve_world_size(c, world_size)
    tp, pp = c["model_parallel_size"], c["pipe_parallel_size"]
    dp = data_parallel_size(world, tp, pp)
    train, micro, accum = resolve_batch_sizes(
        dp, c["train_batch_size"], c["train_micro_batch_size_per_gpu"],
        c["gradient_accumulation_steps"],
    )
    decay_iters = decay_iterations(c["train_iters"], c["lr_decay_iters"], c["lr_decay_fraction"])
    return Derived(
        world_size=world,
        num_nodes=nodes,
        num_gpus=gpus,
        data_parallel_size=dp,
        pipeline_stages=pipeline_stages(pp),
        is_pipe_parallel=pp >= 2,
        train_batch_size=train,
        train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=accum,
        precision=resolve_precision(c["precision"], c["fp16"], c["bf16"]),
        lr_decay_iters=decay_iters,
        warmup_iters=c["warmup"] * decay_iters,  # a fraction, as GPT-NeoX keeps it
        attention_types=expand_attention_types(c["attention_config"], c["num_layers"]),
        intermediate_size=mlp_width(
            c["hidden_size"], c["intermediate_size"], c["activation"], c["mlp_multiple_of"]
        ),
        mamba_inner_size=mamba_inner_size(c["hidden_size"], c["intermediate_size"]),
        num_kv_heads=c["num_kv_heads"] or c["num_attention_heads"],
        head_dim=c["hidden_size"] // c["num_attention_heads"],
        zero_stage=int(c["zero_optimization"].get("stage", 0)),
        save_iters=save_iterations(
            c["train_iters"], c["checkpoint_factor"], c["checkpoint_scale"], c["extra_save_iters"]
        ),
        text_gen_type=c["text_gen_type"]
        or ("input-file" if c["sample_input_file"] else "unconditional"),
        output_dir=output_dir(c["log_dir"], c["load"]),
        sample_output_path=sample_output_path(c["sample_output_file"],
                                              output_dir(c["log_dir"], c["load"])),
    )
