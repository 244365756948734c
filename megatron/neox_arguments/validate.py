"""A15: the config is consistent. Every rule names the keys, their values and what must hold.

`validate(c, world_size, origins)` checks the flat, typed config `c` (every field, after merging)
and raises one `ConfigError` listing every broken rule. Required keys are checked first: the
other rules need them. A rule about one key's value yields a `BadValue` at its key path, and its
message starts with where that value was set (`origins`: the file or command-line override).
Warnings (settings that are ignored) go to the project logger.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable, Mapping

from . import derived as d
from .errors import BadValue, ConfigError, Problems
from .load import origins_of
from .registries import REGISTRIES, check_choice
from .sections.deepspeed import (BF16_KEYS, FP16_KEYS, GRAD_ACCUM_DTYPES, NEOX_FP16_EXTRA_KEYS,
                                 SWITCH_KEYS, ZERO_KEYS)
from .sections.launcher import MPI_LAUNCHERS
from .validate_mamba import mamba_rules
from .validate_moe import moe_rules
from .validate_optimizer import optimizer_rules
from .validate_post_training import post_training_rules


Config = Mapping[str, Any]
REQUIRED = (
    "num_layers", "hidden_size", "num_attention_heads", "seq_length",
    "max_position_embeddings", "train_iters",
)
# DeepSpeed entries generated from dedicated keys; deepspeed_extra_args must not repeat them.
GENERATED_DS_KEYS = {
    "train_batch_size": "train_batch_size", "train_micro_batch_size_per_gpu":
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping", "zero_optimization": "zero_optimization",
    "fp16": "fp16 / precision", "bf16": "bf16 / precision", "steps_per_print": "steps_per_print",
    "wall_clock_breakdown": "wall_clock_breakdown", "zero_allow_untested_optimizer":
    "zero_allow_untested_optimizer", "optimizer": "optimizer (built in torch, never by DeepSpeed)",
    "scheduler": "lr_decay_style (the schedule runs outside DeepSpeed)",
    "data_types": "data_types",
    "activation_checkpointing": "checkpoint_activations, checkpoint_num_layers, "
    "partition_activations, contiguous_checkpointing, checkpoint_in_cpu, synchronize_each_layer",
}


def validate(
    c: Config, world_size: int | None = None, origins: Mapping[str, str | None] | None = None
) -> None:
    """Raise `ConfigError` listing every consistency rule `c` breaks (A15); `origins` says where
    each value was set, by key path (load.Resolved.origins)."""
    found = list(_required(c))
    if not found:
        for rule in RULES:
            found.extend(rule(c, world_size))
    problems = [_located(p, origins or {}) for p in found]
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(
            f"The config has {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
        )


def _located(problem: str | BadValue, origins: Mapping[str, str | None]) -> str:
    """The problem's message, after where its value was set when it is about one value."""
    if isinstance(problem, str):
        return problem
    where = " and ".join(origins_of(origins, problem.path))
    return f"{where}: {problem.message}" if where else problem.message


def _required(c: Config) -> Problems:
    for key in REQUIRED:
        if c[key] is None:
            yield f"{key} is required but not set; add it to a config file or the command line."
        elif c[key] < 1:
            yield BadValue(key, f"{key}({c[key]}) must be at least 1.")


def _choice(key: str, value: str) -> Problems:
    try:
        check_choice(key, value)
    except ConfigError as e:
        yield BadValue(key, str(e))


def _choices(c: Config, world_size: int | None) -> Problems:
    for key in REGISTRIES:
        if isinstance(c.get(key), str):  # attention_config and optimizer.type are checked apart
            yield from _choice(key, c[key])
    method = c["pipe_partition_method"]
    if method.startswith("type:"):
        try:
            re.compile(method[len("type:"):])
        except re.error as e:
            yield BadValue("pipe_partition_method", f"pipe_partition_method '{method}' has an "
                                                    f"invalid regex after 'type:': {e}.")
        else:
            yield from _partition_matches(c, method)
    elif method not in ("parameters", "uniform"):
        yield BadValue("pipe_partition_method", (
            f"pipe_partition_method '{method}' is not valid; use parameters, uniform or "
            "type:<regex> (e.g. type:transformer)."
        ))


# the class of each kind of block in the pipeline (megatron/model/gpt.py, mamba.py)
BLOCK_CLASSES = {"transformer": "TransformerLayerPipe", "mamba": "MambaLayerPipe"}


def _partition_matches(c: Config, method: str) -> Problems:
    """DeepSpeed's pipeline balances `type:<regex>` over the layers whose class name the regex
    finds (any case) and fails inside every worker when it finds none: name the blocks."""
    if c["pipe_parallel_size"] < 1:
        return
    try:
        types = set(d.expand_attention_types(c["attention_config"], c["num_layers"]))
    except ConfigError:
        return  # reported by _attention
    kinds = sorted({"mamba" if t == "mamba" else "transformer" for t in types}, reverse=True)
    pattern = re.compile(method[len("type:"):], re.IGNORECASE)
    if not any(pattern.search(BLOCK_CLASSES[k]) for k in kinds):
        yield BadValue("pipe_partition_method", (
            f"pipe_partition_method '{method}' matches none of this model's blocks "
            f"({', '.join(BLOCK_CLASSES[k] for k in kinds)}), so the pipeline stages cannot "
            f"be balanced by it: use type:{'|'.join(kinds)} or parameters."))


def _transformer_layers(c: Config) -> bool:
    """Whether any layer is a transformer layer (attention and MLP): not all `mamba`. The
    attention and MLP rules do not apply to a model of Mamba layers only, as in GPT-NeoX."""
    try:
        return set(d.expand_attention_types(c["attention_config"], c["num_layers"])) != {"mamba"}
    except ConfigError:
        return True  # reported by _attention


def _heads(c: Config, world_size: int | None) -> Problems:
    h, heads, tp = c["hidden_size"], c["num_attention_heads"], c["model_parallel_size"]
    if tp < 1:
        yield BadValue("model_parallel_size", f"model_parallel_size({tp}) must be at least 1.")
        return
    if not _transformer_layers(c):
        return
    if h % heads:
        yield f"hidden_size({h}) % num_attention_heads({heads}) = {h % heads}; it must be 0."
    if heads % tp:
        yield (
            f"num_attention_heads({heads}) % model_parallel_size({tp}) = {heads % tp}; "
            "it must be 0 so every tensor-parallel rank gets whole heads."
        )
    kv = c["num_kv_heads"]
    if kv is not None:
        if kv < 1 or heads % kv:
            yield f"num_kv_heads({kv}) must divide num_attention_heads({heads})."
        elif kv % tp:
            yield (
                f"num_kv_heads({kv}) % model_parallel_size({tp}) = {kv % tp}; it must be 0 so "
                "every tensor-parallel rank gets whole key/value heads."
            )


def _shape(c: Config, world_size: int | None) -> Problems:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    if c["seq_length"] > c["max_position_embeddings"]:
        yield (
            f"seq_length({c['seq_length']}) > max_position_embeddings"
            f"({c['max_position_embeddings']}); seq_length must be at most max_position_embeddings."
        )
    if c["pipe_parallel_size"] < 0:
        yield BadValue("pipe_parallel_size",
                       f"pipe_parallel_size({c['pipe_parallel_size']}) must be 0 or more.")
    elif c["pipe_parallel_size"] > c["num_layers"]:
        yield (
            f"pipe_parallel_size({c['pipe_parallel_size']}) > num_layers({c['num_layers']}); "
            "every pipeline stage needs at least one layer."
        )
    if c["pos_emb"] == "rotary" and h % heads == 0 and _transformer_layers(c):
        rot = int(h // heads * c["rotary_pct"])
        if not 0 < c["rotary_pct"] <= 1 or rot < 2 or rot % 2:
            yield BadValue("rotary_pct", (
                f"rotary_pct({c['rotary_pct']}) * head dim({h // heads}) = {rot} rotary dims; "
                "rotary_pct must be in (0, 1] and give an even number of at least 2."
            ))
    yield from _at_least(c, 1, "mlp_multiple_of", "make_vocab_size_divisible_by",
                         "intermediate_size", "checkpoint_num_layers", "rotary_emb_base")
    for key in ("hidden_dropout", "attention_dropout"):
        if not 0 <= c[key] < 1:
            yield BadValue(key, f"{key}({c[key]}) must be in [0, 1).")
    for key in ("init_method_std", "layernorm_epsilon", "rms_norm_epsilon", "scalenorm_epsilon"):
        if not c[key] > 0:
            yield BadValue(key, f"{key}({c[key]}) must be greater than 0.")


def _attention(c: Config, world_size: int | None) -> Problems:
    try:
        types = d.expand_attention_types(c["attention_config"], c["num_layers"])
    except ConfigError as e:
        yield BadValue("attention_config", str(e))
        return
    if len(types) != c["num_layers"]:
        yield (
            f"attention_config expands to {len(types)} layer types but num_layers is "
            f"{c['num_layers']}; they must match."
        )
    for name in sorted(set(types)):
        yield from _choice("attention_config", name)
    width = c["sliding_window_width"]
    if "local" in types and width is None:
        yield "attention_config has local layers, so sliding_window_width must be set."
    if width is not None and width < 1:
        yield BadValue("sliding_window_width", f"sliding_window_width({width}) must be at least 1.")
    if width is not None and not {"flash", "local"} & set(types):
        yield (
            f"sliding_window_width({width}) is set but no layer uses it: only 'flash' and "
            "'local' attention layers (attention_config) have a sliding window."
        )


def _world_size(c: Config, world_size: int | None) -> tuple[int, str]:
    """(the world size the rules assume, how it was obtained, for messages)."""
    world = d.resolve_world_size(c, world_size)
    if world_size is not None:
        return world, f"{world}"
    return world, f"num_nodes({c['num_nodes']}) * num_gpus({c['num_gpus']}) = {world}"


def _world(c: Config, world_size: int | None) -> Problems:
    tp, pp = c["model_parallel_size"], c["pipe_parallel_size"]
    world, where = _world_size(c, world_size)
    stages = d.pipeline_stages(pp)
    if world < 1 or tp < 1 or pp < 0:
        return  # reported by the num_gpus / degree rules
    if world % (tp * stages):
        yield (
            f"world_size({where}) is not divisible by model_parallel_size({tp}) * "
            f"pipe_parallel_size({stages}) = {tp * stages}: data_parallel_size = world_size / "
            "(model_parallel_size * pipe_parallel_size) must be a whole number; change the "
            "degrees or num_nodes / num_gpus."
        )
        return
    stage = c["zero_optimization"].get("stage", 0)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage <= 3:
        yield BadValue("zero_optimization.stage",
                       f"zero_optimization.stage({stage!r}) must be 0, 1, 2 or 3.")
    elif stage >= 2 and pp >= 1:
        yield (
            f"zero_optimization.stage({stage}) with pipe_parallel_size({pp}): DeepSpeed's "
            "pipeline engine (pipe_parallel_size 1 or more, one stage included) supports ZeRO "
            "stage 0 or 1 only; lower the stage or set pipe_parallel_size to 0 (a plain module "
            "without the pipeline engine)."
        )
    dp = d.data_parallel_size(world, tp, pp)
    problems = list(_batch_triple(c, dp))
    yield from problems
    if not problems:
        try:
            d.resolve_batch_sizes(
                dp, c["train_batch_size"], c["train_micro_batch_size_per_gpu"],
                c["gradient_accumulation_steps"],
            )
        except ConfigError as e:
            yield str(e)


def _global_num_gpus(c: Config, world_size: int | None) -> Problems:
    """GPT-NeoX's global_num_gpus is the number of processes, derived here: a value is checked.

    With a hostfile and no launcher-given world size the check waits for the launch, which
    counts the hostfile's slots and validates again (`with_world_size`).
    """
    given = c["global_num_gpus"]
    if given is None or (world_size is None and c["hostfile"]):
        return
    world, where = _world_size(c, world_size)
    if given != world:
        yield (
            f"global_num_gpus({given}) != world_size({where}): the world size is derived from "
            "num_nodes and num_gpus (processes per node) here; set them to give "
            f"{given} processes, or remove global_num_gpus."
        )


def _batch_triple(c: Config, dp: int) -> Problems:
    train, micro, accum = (
        c["train_batch_size"], c["train_micro_batch_size_per_gpu"], c["gradient_accumulation_steps"]
    )
    for key, value in (("train_batch_size", train), ("train_micro_batch_size_per_gpu", micro),
                       ("gradient_accumulation_steps", accum)):
        if value is not None and value < 1:
            yield BadValue(key, f"{key}({value}) must be at least 1.")
            return
    if None not in (train, micro, accum) and train != micro * accum * dp:
        yield (
            f"train_micro_batch_size_per_gpu({micro}) * gradient_accumulation_steps({accum}) * "
            f"data_parallel_size({dp}) = {micro * accum * dp} != train_batch_size({train}); "
            "give any two of the three and the third is derived."
        )


def _precision(c: Config, world_size: int | None) -> Problems:
    fp16, bf16, precision = c["fp16"], c["bf16"], c["precision"]
    for name, section, known in (("fp16", fp16, FP16_KEYS + NEOX_FP16_EXTRA_KEYS),
                                 ("bf16", bf16, BF16_KEYS)):
        for key in sorted(set(section or ()) - set(known)):
            yield BadValue(f"{name}.{key}", f"{name}.{key} is not a DeepSpeed {name} option; "
                                            f"valid keys: {', '.join(known)}.")
        for key in SWITCH_KEYS:
            value = (section or {}).get(key)
            if value is not None and not isinstance(value, bool):
                yield BadValue(f"{name}.{key}", (
                    f"{name}.{key} must be true or false, but it is {value!r} "
                    f"({type(value).__name__}); write it without quotes."))
                return
    if (fp16 or {}).get("enabled") and (bf16 or {}).get("enabled"):
        yield "fp16.enabled and bf16.enabled are both true; enable one precision mode only."
        return
    if precision is None:
        return
    wanted = d.resolve_precision(precision, None, None)
    modes = d.enabled_precision_modes(fp16, bf16)
    if modes and modes != [wanted]:
        yield f"precision is '{precision}' but the {modes[0]} section is enabled; make them agree."
    for name, section in (("fp16", fp16), ("bf16", bf16)):
        if wanted == name and section and section.get("enabled") is False:
            yield f"precision is '{precision}' but {name}.enabled is false; make them agree."


def _zero_keys(c: Config, world_size: int | None) -> Problems:
    """zero_optimization: only keys DeepSpeed's ZeRO config takes (it refuses any other in every
    worker, in pydantic's words)."""
    for key in sorted(set(c["zero_optimization"]) - set(ZERO_KEYS)):
        close = difflib.get_close_matches(key, ZERO_KEYS, n=3)
        yield BadValue(f"zero_optimization.{key}", (
            f"zero_optimization.{key} is not a DeepSpeed ZeRO option"
            + (f" (did you mean: {', '.join(close)}?)" if close else "")
            + "; see DeepSpeed's ZeRO configuration for the valid keys."))


def _data_types(c: Config, world_size: int | None) -> Problems:
    """data_types.grad_accum_dtype: a dtype DeepSpeed can accumulate gradients in here."""
    data_types = c["data_types"] or {}
    for key in sorted(set(data_types) - {"grad_accum_dtype"}):
        yield BadValue(f"data_types.{key}", (
            f"data_types.{key} is not supported; only grad_accum_dtype is (parameters and "
            "buffers take the precision's dtype)."))
    accum = data_types.get("grad_accum_dtype")
    if accum is None:
        return
    if accum not in GRAD_ACCUM_DTYPES:
        yield BadValue("data_types.grad_accum_dtype", (
            f"data_types.grad_accum_dtype({accum!r}) must be one of "
            f"{', '.join(GRAD_ACCUM_DTYPES)}."))
        return
    precision = d.resolve_precision(c["precision"], c["fp16"], c["bf16"])
    stage = c["zero_optimization"].get("stage", 0)
    if GRAD_ACCUM_DTYPES[accum] != precision and stage not in (1, 2):
        yield (f"data_types.grad_accum_dtype({accum}) differs from the precision ({precision}); "
               "DeepSpeed accumulates gradients in another dtype than the model's only with "
               f"ZeRO stage 1 or 2, and zero_optimization.stage is {stage}: set stage 1 (with "
               "bf16 and fp32, DeepSpeed's bf16 optimizer), or remove data_types.")


def _at_least(c: Config, minimum: int, *keys: str) -> Problems:
    for key in keys:
        if c[key] is not None and c[key] < minimum:
            yield BadValue(key, f"{key}({c[key]}) must be at least {minimum}.")


def _intervals(c: Config, world_size: int | None) -> Problems:
    yield from _at_least(c, 1, "lr_decay_iters", "eval_interval", "log_interval",
                         "steps_per_print", "exit_interval", "keep_last_n_checkpoints",
                         "maximum_tokens", "num_samples", "num_gpus", "omp_num_threads",
                         "generation_batch_size", "eval_batch_size", "loss_spike_window",
                         "max_bad_steps")
    yield from _at_least(c, 0, "max_rollbacks", "eval_iters", "num_workers", "iteration", "top_k",
                         "eval_num_fewshot", "temperature", "eval_bootstrap_iters",
                         "hang_timeout_minutes", "hang_step_factor",
                         "hang_timeout_checkpoint_minutes")
    if not 0 <= c["seed"] < 2**32:
        yield BadValue("seed", f"seed({c['seed']}) must be in [0, 2**32).")
    if c["loss_spike_factor"] is not None and c["loss_spike_factor"] <= 1:
        yield BadValue("loss_spike_factor", (
            f"loss_spike_factor({c['loss_spike_factor']}) must be above 1 (a loss that many "
            "times the recent mean is a spike), or null."))
    if not 0 <= c["top_p"] <= 1:
        yield BadValue("top_p", f"top_p({c['top_p']}) must be in [0, 1].")
    if c["text_gen_type"] == "input-file" and not c["sample_input_file"]:
        yield "text_gen_type is input-file, so sample_input_file must be set."


def _profiling(c: Config, world_size: int | None) -> Problems:
    if not (c["profile"] or c["memory_profiling"]):
        return
    start, stop, iters = c["profile_step_start"], c["profile_step_stop"], c["train_iters"]
    window = f"profile_step_start({start}) and profile_step_stop({stop})"
    if start < 0:
        yield BadValue("profile_step_start", f"profile_step_start({start}) must be at least 0.")
    elif stop <= start:
        yield (f"{window}: profile_step_stop must be greater than profile_step_start (the steps "
               "after iteration profile_step_start up to profile_step_stop are profiled).")
    elif stop > iters:
        yield (f"{window} reach beyond train_iters({iters}): those steps would not all run; "
               "set profile_step_stop to at most train_iters.")
    if c["profile"] and not (c["tensorboard_dir"] or c["log_dir"]):
        yield ("profile is true but neither tensorboard_dir nor log_dir is set; set "
               "tensorboard_dir to the directory the trace should go to.")
    if c["memory_profiling"] and not c["memory_profiling_path"]:
        yield ("memory_profiling is true but memory_profiling_path is not set; set it to the "
               "directory the memory profile should go to.")


def _checkpoint(c: Config, world_size: int | None) -> Problems:
    factor, extra = c["checkpoint_factor"], c["extra_save_iters"]
    if c["save"] is not None and factor is None and extra is None:
        yield (
            f"save is set ({c['save']}) but neither checkpoint_factor nor extra_save_iters is; "
            "set checkpoint_factor (e.g. 1000) to say when to save."
        )
    if factor is not None:
        low = 1 if c["checkpoint_scale"] == "linear" else 1.0000001
        if factor < low:
            yield (
                f"checkpoint_factor({factor}) with checkpoint_scale {c['checkpoint_scale']} must "
                f"be {'at least 1' if low == 1 else 'greater than 1'}."
            )
        elif c["checkpoint_scale"] == "linear" and factor != int(factor):
            yield (  # GPT-NeoX asserts the same
                f"checkpoint_factor({factor}) with checkpoint_scale linear must be a whole number "
                "of iterations between saves; a factor between whole numbers is for "
                "checkpoint_scale log."
            )
    if extra is not None and any(i < 0 for i in extra):
        yield BadValue("extra_save_iters",
                       f"extra_save_iters({extra}) must not contain negative iterations.")


def _activation_checkpointing(c: Config, world_size: int | None) -> Problems:
    # without checkpoint_activations the other checkpointing options have nothing to act on;
    # GPT-NeoX accepts them (its pythia/14M.yml and 31M.yml set synchronize_each_layer), and
    # the run's start-up says they change nothing (megatron/model/recompute.py)
    if (c["checkpoint_activations"] and c["contiguous_checkpointing"]
            and not c["partition_activations"]):
        yield ("contiguous_checkpointing is true but partition_activations is false; DeepSpeed "
               "copies only partitioned checkpoints into its contiguous buffers: set "
               "partition_activations: true or remove contiguous_checkpointing.")


def _data(c: Config, world_size: int | None) -> Problems:
    try:
        parts = [float(p) for p in c["split"].replace("/", ",").split(",") if p.strip()]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        yield BadValue("split", f"split('{c['split']}') must be up to three non-negative "
                                'numbers, e.g. "949,50,1".')
    names = ("train", "valid", "test")
    given = [c[f"{n}_data_paths"] is not None for n in names]
    if any(given) and not all(given):
        yield "train_data_paths, valid_data_paths and test_data_paths must be given together."
    if all(given) and c["data_path"] is not None:
        yield "Give either data_path or train/valid/test_data_paths, not both."
    for n in names:
        paths, weights = c[f"{n}_data_paths"], c[f"{n}_data_weights"]
        if weights is not None and (paths is None or len(weights) != len(paths)):
            count = "no" if paths is None else len(paths)
            yield (
                f"{n}_data_weights has {len(weights)} entries but {n}_data_paths has {count}; "
                "give one weight per path."
            )


def _launcher(c: Config, world_size: int | None) -> Problems:
    nodes, rank = c["num_nodes"], c["node_rank"]
    if nodes == 0 or nodes < -1:
        yield BadValue("num_nodes", f"num_nodes({nodes}) must be -1 (all hosts) or at least 1.")
    if rank is not None and (rank < 0 or (nodes >= 1 and rank >= nodes)):
        yield f"node_rank({rank}) must be in [0, num_nodes({nodes}))."
    if c["no_ssh"] and d.resolve_num_nodes(nodes) > 1 and rank is None:
        yield "no_ssh launches one node at a time, so node_rank must be set when num_nodes > 1."
    if (c["no_ssh"] or rank is not None) and not c["hostfile"]:
        given = " and ".join(["no_ssh"] * c["no_ssh"] + ["node_rank"] * (rank is not None))
        yield (f"{given} set without a hostfile: launching one node of a multi-node job needs "
               "the hostfile listing every node; add hostfile=<path> (one 'hostname slots=N' "
               f"line per node), or remove {given} to run on this machine only.")
    if c["master_port"] is not None and not 1 <= c["master_port"] <= 65535:
        yield BadValue("master_port", f"master_port({c['master_port']}) must be in [1, 65535].")
    yield from _rank_discovery(c)
    if not c["distributed_timeout_minutes"] > 0:
        minutes = c["distributed_timeout_minutes"]
        yield BadValue("distributed_timeout_minutes",
                       f"distributed_timeout_minutes({minutes}) must be greater than 0.")
    yield from _at_least(c, 0, "max_restarts")
    if c["max_restarts"] and not c["save"]:
        yield (f"max_restarts({c['max_restarts']}) restarts from the checkpoints in `save`, which "
               "is not set; set save=<dir> (and checkpoint_factor), or max_restarts=0.")
    if c["max_restarts"] and c["no_ssh"]:
        yield (f"max_restarts({c['max_restarts']}) cannot restart a job launched one node at a "
               "time (no_ssh): the nodes would restart apart; restart the job from outside "
               "(e.g. your scheduler's requeue), or set max_restarts=0.")
    if not c["signal_grace_seconds"] >= 0:
        yield BadValue("signal_grace_seconds", (
            f"signal_grace_seconds({c['signal_grace_seconds']}) must be 0 or more (seconds "
            "the workers get to save and exit after a signal)."))
    if c["memory_check"] not in (True, False, "warn"):
        yield BadValue("memory_check",
                       f"memory_check({c['memory_check']!r}) must be true, false or 'warn'.")
    bad = [v for v in c["export_env_vars"] if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v)]
    if bad:
        yield BadValue("export_env_vars", f"export_env_vars has invalid variable names: "
                                          f"{', '.join(map(repr, bad))}.")


def _rank_discovery(c: Config) -> Problems:
    """deepspeed_mpi / deepspeed_slurm: workers read ranks that only mpirun / srun set."""
    mpi, slurm, launcher = c["deepspeed_mpi"], c["deepspeed_slurm"], c["launcher"]
    if mpi and slurm:
        yield "deepspeed_mpi and deepspeed_slurm are both true; set the one of the launcher used."
    elif (mpi or slurm) and c["no_ssh"]:
        key = "deepspeed_mpi" if mpi else "deepspeed_slurm"
        yield (f"{key} reads ranks that mpirun / srun set, but no_ssh starts each node's workers "
               f"with DeepSpeed's own launcher; remove {key} or no_ssh.")
    elif slurm and launcher != "slurm":  # the hostfile srun needs is checked at launch
        yield (f"deepspeed_slurm reads ranks from the variables srun sets, but launcher is "
               f"'{launcher}': set launcher: slurm, or remove deepspeed_slurm.")
    elif mpi and (launcher not in MPI_LAUNCHERS or not c["hostfile"]):
        yield (f"deepspeed_mpi reads ranks from the variables mpirun sets, but launcher is "
               f"'{launcher}' and hostfile is {c['hostfile'] or 'not set'}: set launcher to one "
               f"of {', '.join(MPI_LAUNCHERS)} and a hostfile, or remove deepspeed_mpi.")


def _logging(c: Config, world_size: int | None) -> Problems:
    peak = c["peak_theoretical_tflops"]
    if peak is not None and not peak > 0:
        yield BadValue("peak_theoretical_tflops", (
            f"peak_theoretical_tflops({peak}) must be greater than 0 (one GPU's peak TFLOP/s), "
            "or null to log no MFU."
        ))
    if not re.match(r"^https?://[^/\s]+", c["wandb_host"]):
        yield BadValue("wandb_host", f"wandb_host('{c['wandb_host']}') must be a URL such as "
                                     "https://api.wandb.ai.")


def _deepspeed_extra(c: Config, world_size: int | None) -> Problems:
    for key in sorted(set(c["deepspeed_extra_args"] or ()) & set(GENERATED_DS_KEYS)):
        yield BadValue(f"deepspeed_extra_args.{key}", (
            f"deepspeed_extra_args.{key} would replace the value generated from "
            f"{GENERATED_DS_KEYS[key]}; set that key instead."
        ))


def _tensor_parallel_splits(c: Config, world_size: int | None) -> Problems:
    tp = c["model_parallel_size"]
    if tp < 1:
        return
    ffn = 0 if not _transformer_layers(c) else d.mlp_width(
        c["hidden_size"], c["intermediate_size"], c["activation"], c["mlp_multiple_of"])
    if ffn % tp:
        yield (
            f"MLP width({ffn}, from intermediate_size / hidden_size and activation) % "
            f"model_parallel_size({tp}) = {ffn % tp}; it must be 0 so every tensor-parallel rank "
            "gets an equal slice (set intermediate_size or mlp_multiple_of)."
        )
    if c["sequence_parallel"] and c["seq_length"] % tp:
        yield (
            f"sequence_parallel splits the sequence over model_parallel_size({tp}) ranks: "
            f"seq_length({c['seq_length']}) % {tp} = {c['seq_length'] % tp}; it must be 0."
        )


RULES: tuple[Callable[[Config, int | None], Problems], ...] = (
    _choices, _heads, _tensor_parallel_splits, _shape, _attention, _world, _global_num_gpus,
    _precision, _zero_keys, _data_types, optimizer_rules, _intervals, _profiling, _checkpoint,
    _activation_checkpointing, _data, _launcher, _logging, _deepspeed_extra, post_training_rules,
    moe_rules, mamba_rules,
)
