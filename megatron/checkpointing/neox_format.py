"""Checkpoints written by GPT-NeoX itself: recognised, described, and read as layout-free state.

A GPT-NeoX checkpoint is DeepSpeed's files with no manifest:

    <save>/latest                              the tag of the newest checkpoint
    <save>/global_step<N>/                     (GPT-NeoX's converters name it e.g. "0")
        configs/<name>.yml                     the config files the run started with (training
                                               saves them; the converters do not)
        mp_rank_<SS>_model_states.pt           per model-parallel slice SS = stage * tp + tensor
                                               rank: iteration, args, lr_scheduler, counters,
                                               ds_config, param_shapes (ZeRO >= 1), optimizer
                                               (ZeRO 0), module (sequential models)
        layer_<II>-model_<TT>-model_states.pt  pipeline models: layer II's tensors, tensor rank TT
        zero_pp_rank_<D>_mp_rank_<SS>_optim_states.pt   ZeRO 1/2: data-parallel rank D's part

GPT-NeoX's layer indices are 0 embedding, 1 (a function), 2..L+1 transformer layers, L+2 (a
function), L+3 final norm, L+4 untied output linear; a sequential model names its tensors
`sequential.<index>.<path>` with the same indices. Ours are 0, 1..L, L+1, L+2
(megatron.model.partition). Per tensor rank, GPT-NeoX's model code lays out:
- attention.query_key_value: heads interleaved [q, k, v] per head, which is our layout; with
  grouped-query attention (num_kv_heads != num_attention_heads) [that rank's q heads; its k
  heads; its v heads], reordered here into our per-KV-group blocks [q.., k, v]
- a gated MLP's linear1: [value; gate] with act(gate) * value, our layout per rank
- names: linear1/linear2 (older: dense_h_to_4h/dense_4h_to_h, or w1 gate, w3 up, w2 down),
  RMSNorm's scale/offset, the final norm `norm.*`, the output `final_linear.weight`; rotary
  `inv_freq` buffers are dropped
- mixture-of-experts layers (ParallelDroplessMoE): the router `mlp.router.layer.weight`
  [E, h], whole on every rank, is our `mlp.router.weight`; a rank's n = E / tp experts (a
  contiguous block, rank r holding experts r n .. r n + n - 1) are `mlp.experts.mlp.w1` and
  `mlp.experts.mlp.w2`, each [n f, h], expert e computing act(x w1_e^T) w2_e with w1_e, w2_e
  its [f, h] rows: our `mlp.experts.w_in` [n, f, h] and `mlp.experts.w_out` [n, h, f]. GPT-NeoX's
  experts apply the activation without a gate (its ParallelGroupedMLP), so a checkpoint whose
  saved config names a gated activation is refused (experts here are gated like the MLP)
Mamba layers (`mixer.*`, `norm.scale`) carry our names; those of a tensor-parallel GPT-NeoX run
are refused (its x_proj is not summed over the ranks). A tensor this model does not have
(RWKV, QK layernorm, ...) is refused by name.

`describe` gives a checkpoint a Manifest (contents["format"] == "gpt-neox", no checksums) so the
one resolver, the compatibility check and the reshard path treat it like ours: its shape keys
come from its saved configs, else from the args GPT-NeoX stores, else from the run's config
(`fill_from_run`), as GPT-NeoX itself would use the run's config. Optimizer state is read where
GPT-NeoX saved it with ZeRO stage 1 or 2 (DeepSpeed's partitioned fp32 groups, named by its
param_shapes); elsewhere `contents["optimizer_note"]` says why the moments restart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from megatron.checkpointing.durable import load_torch
from megatron.checkpointing.errors import CheckpointMismatchError, CorruptFileError
from megatron.checkpointing.layout import CONFIG_NAME, MANIFEST_NAME, RNG_DIR, iteration_of
from megatron.checkpointing.manifest import FileEntry, Manifest
from megatron.checkpointing.shard_index import INDEX_DIR
from megatron.model.partition import Sharding

MARK = "gpt-neox"
CONFIG_DIR = "configs"
_MODEL_FILE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
_LAYER_FILE = re.compile(r"^layer_(\d+)(?:-model_(\d+))?-model_states\.pt$")  # no model axis: 0
_RENAMES = (
    (re.compile(r"^(input_layernorm|post_attention_layernorm|norm)\.scale$"), r"\1.weight"),
    (re.compile(r"^(input_layernorm|post_attention_layernorm|norm)\.offset$"), r"\1.bias"),
    (re.compile(r"^mlp\.(linear1|dense_h_to_4h)\."), "mlp.dense_h_to_4h."),
    (re.compile(r"^mlp\.(linear2|dense_4h_to_h|w2)\."), "mlp.dense_4h_to_h."),
    (re.compile(r"^final_linear\.weight$"), "weight"),
    (re.compile(r"^mlp\.router\.layer\.weight$"), "mlp.router.weight"),
)
_ROUTER = "mlp.router.layer.weight"
_EXPERT_W1, _EXPERT_W2 = "mlp.experts.mlp.w1", "mlp.experts.mlp.w2"
_DROPPED = re.compile(r"(^|\.)(inv_freq|_extra_state)$")
_NORMS = re.compile(r"(^|\.)(input_layernorm|post_attention_layernorm|norm|qk_layernorm)\.\w+$")
_NO_WEIGHT_DECAY = re.compile(r"(^|\.)mixer\.(A_log|D)$")  # marked _no_weight_decay
_OURS = {  # what each kind of our layers holds (parameter paths)
    "embedding": {"word_embeddings.weight", "position_embeddings.weight"},
    "transformer": {f"{m}.{p}" for m in ("input_layernorm", "post_attention_layernorm")
                    for p in ("weight", "bias", "g")}
                   | {f"{m}.{p}" for m in ("attention.query_key_value", "attention.dense",
                                           "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")
                      for p in ("weight", "bias")}
                   | {"mlp.router.weight", "mlp.experts.w_in", "mlp.experts.w_out"},
    "norm": {"norm.weight", "norm.bias", "norm.g"},
    "head": {"weight"},
    # a Mamba layer: GPT-NeoX's names are ours (megatron/model/mamba.py)
    "mamba": {"norm.weight", "norm.bias", "norm.g"}
             | {f"mixer.{m}.{p}" for m in ("in_proj", "conv1d", "x_proj", "dt_proj", "out_proj")
                for p in ("weight", "bias")} | {"mixer.A_log", "mixer.D"},
}


def is_neox(manifest: Manifest) -> bool:
    """Whether `manifest` describes a GPT-NeoX-written checkpoint (see `describe`)."""
    return manifest.contents.get("format") == MARK


def model_file(slice_rank: int) -> str:
    return f"mp_rank_{slice_rank:02d}_model_states.pt"


def is_neox_directory(step_dir: Path) -> bool:
    """A checkpoint directory with DeepSpeed's model files and none of the files only this
    project writes (one of ours whose manifest is lost stays damaged, not foreign)."""
    step_dir = Path(step_dir)
    ours = (MANIFEST_NAME, CONFIG_NAME, RNG_DIR, INDEX_DIR)
    return (step_dir / model_file(0)).is_file() and not any((step_dir / n).exists() for n in ours)


# --- describing a directory -------------------------------------------------------------------

def describe(step_dir: Path) -> Manifest:
    """A Manifest for the GPT-NeoX checkpoint in `step_dir` (file sizes, no checksums);
    CorruptFileError when it is not one or its files cannot be read."""
    step_dir = Path(step_dir)
    names = sorted(p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*") if p.is_file())
    slices = sorted(int(m.group(1)) for m in map(_MODEL_FILE.match, names) if m)
    if 0 not in slices:
        raise CorruptFileError(f"{step_dir}: no manifest.json and no {model_file(0)}: not a "
                               "checkpoint of this project or of GPT-NeoX")
    try:
        first = load_torch(step_dir / model_file(0), map_location="cpu")
    except Exception as err:  # noqa: BLE001 - any unpickling failure means an unreadable file
        raise CorruptFileError(f"{step_dir / model_file(0)}: cannot be read ({err})") from None
    config = saved_config(step_dir)
    args = {**(first.get("args") or {}), **config}
    layers = sorted({_layer_and_rank(m) for m in map(_LAYER_FILE.match, names) if m})
    tp = int(args.get("model_parallel_size") or (len({t for _, t in layers}) if layers
                                                 else first.get("mp_world_size") or len(slices)))
    ds = first.get("ds_config") or {}
    zero = int((ds.get("zero_optimization") or {}).get("stage", 0))
    iteration = first.get("iteration", first.get("total_iters"))
    if iteration is None:
        iteration = iteration_of(step_dir.name) or 0
    run = {"tp": tp, "pp": max(1, len(slices) // tp),
           "pipe_parallel_size": int(args.get("pipe_parallel_size", 1 if layers else 0)),
           "dp": first.get("dp_world_size"), "world_size": None, "zero_stage": zero,
           "precision": _precision(ds),
           **_shape(args, bool(config), step_dir, names, first, tp)}
    note = _optimizer_note(step_dir, first, run, names)
    return Manifest(
        iteration=int(iteration), tag=step_dir.name, run=run,
        contents={"format": MARK, "engine": False, "rng": False, "optimizer": note is None,
                  "optimizer_note": note},
        client_state={"iteration": int(iteration)}, config=config,
        files={n: FileEntry((step_dir / n).stat().st_size, "", 0) for n in names},
        versions={"deepspeed": first.get("ds_version")})


def saved_config(step_dir: Path) -> dict:
    """The config files GPT-NeoX saved in `<step>/configs/`, merged (keys with '_'); {} when
    there are none. Two files giving one key different values is CorruptFileError (GPT-NeoX
    refuses a key set twice)."""
    merged: dict = {}
    origin: dict = {}
    folder = Path(step_dir) / CONFIG_DIR
    for path in sorted(folder.glob("*")) if folder.is_dir() else []:
        if path.suffix not in (".yml", ".yaml", ".json"):
            continue
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as err:
            raise CorruptFileError(f"{path}: cannot be read as YAML ({err})") from None
        for key, value in (data.items() if isinstance(data, dict) else ()):
            key = str(key).replace("-", "_")
            if key in merged and merged[key] != value:
                raise CorruptFileError(f"{path} sets {key}={value!r} but {origin[key]} sets "
                                       f"{merged[key]!r}: the saved configs disagree")
            merged[key], origin[key] = value, path
    return merged


def _precision(ds_config: dict) -> str:
    if (ds_config.get("bf16") or {}).get("enabled"):
        return "bf16"
    if (ds_config.get("fp16") or {}).get("enabled"):
        return "fp16"
    return "fp32"


def _shape(args: dict, configured: bool, step_dir: Path, names, first: dict, tp: int) -> dict:
    """The manifest's shape keys: from the saved configs (`configured`) and the args GPT-NeoX
    stores; None where they say nothing (fill_from_run completes them); the vocabulary and the
    Mamba blocks from the tensors of tensor rank 0 themselves."""
    from megatron.neox_arguments.derived import mlp_width

    heads, hidden = args.get("num_attention_heads"), args.get("hidden_size")
    intermediate = kv = None
    if configured and hidden and heads:
        intermediate = mlp_width(hidden, args.get("intermediate_size"),
                                 args.get("activation", "gelu"), args.get("mlp_multiple_of", 1))
        kv = args.get("num_kv_heads") or heads
    layers = _rank_tensors(step_dir, names, 0) if any(map(_LAYER_FILE.match, names)) else {}
    if not layers:  # sequential: the module in the model file already read
        for key, tensor in (first.get("module") or {}).items():
            layer, path = _split_name(key, step_dir / model_file(0))
            layers.setdefault(layer, {})[path] = tensor
    table = layers.get(0, {}).get("word_embeddings.weight")
    # Mamba blocks (GPT-NeoX layer index - 2) from the tensors themselves: their mixer
    mamba = sorted(i - 2 for i, tensors in layers.items() if "mixer.D" in tensors)
    return {"num_layers": args.get("num_layers"), "hidden_size": hidden,
            "num_attention_heads": heads, "num_kv_heads": kv, "intermediate_size": intermediate,
            "padded_vocab_size": None if table is None else int(table.shape[0]) * tp,
            **_moe_shape(layers, args, step_dir),
            "mamba_layers": mamba,
            "mamba_inner_size": int(layers[mamba[0] + 2]["mixer.D"].shape[0]) * tp if mamba else 0}


def _moe_shape(layers: dict[int, dict], args: dict, step_dir: Path) -> dict:
    """moe_num_experts (the routers' rows; 1 without routers) and moe_expert_interval (saved,
    else the step between the layers holding routers; None when only layer 0 does and nothing
    says more: the run's config gives it). CorruptFileError when the layers holding experts
    are not every interval-th one, GPT-NeoX's rule."""
    moe = sorted(i - 2 for i, tensors in layers.items() if _ROUTER in tensors)
    if not moe:
        return {"moe_num_experts": 1, "moe_expert_interval": 1}
    experts = int(layers[moe[0] + 2][_ROUTER].shape[0])
    interval = args.get("moe_expert_interval")
    if interval is None and len(moe) > 1:
        interval = moe[1] - moe[0]
    count = args.get("num_layers") or len([i for i, t in layers.items()
                                           if any(p.startswith("attention.") for p in t)])
    if interval is not None and moe != list(range(0, int(count), int(interval))):
        raise CorruptFileError(
            f"{step_dir}: GPT-NeoX layers {', '.join(str(i) for i in moe)} (counted from 0) hold "
            f"experts, which is not every layer i with i % moe_expert_interval({interval}) == 0 "
            f"of its {count}: not a model GPT-NeoX builds")
    return {"moe_num_experts": experts,
            "moe_expert_interval": None if interval is None else int(interval)}


def _optimizer_note(step_dir: Path, first: dict, run: dict, names) -> str | None:
    """None when the optimizer state can be read; else why the moments restart."""
    zero, precision = run["zero_stage"], run["precision"]
    if zero in (1, 2):
        return None if first.get("param_shapes") else (
            "its model files lack DeepSpeed's param_shapes, which name the ZeRO partitions")
    if zero == 3:
        return "GPT-NeoX saved it with ZeRO stage 3, whose partitions this reader does not map"
    if not first.get("optimizer") or not first["optimizer"].get("state"):
        return "it holds no optimizer state (e.g. written by a GPT-NeoX converter)"
    if precision != "fp32":
        return (f"GPT-NeoX saved it without ZeRO in {precision}, through DeepSpeed's "
                f"{precision} optimizer, whose state this reader does not map (ZeRO 1 and 2 "
                "states, and fp32 without ZeRO, are read)")
    if run["pp"] > 1:
        return ("GPT-NeoX saved it without ZeRO over several pipeline stages, whose parameter "
                "order this reader does not map")
    layers = _rank_tensors(step_dir, names, 0)
    if _torch_groups(layers, first["optimizer"]) is None:
        return ("its optimizer's parameter groups do not follow GPT-NeoX's order for the "
                "tensors in its files")
    return None


def _layer_and_rank(match: re.Match) -> tuple[int, int]:
    return int(match.group(1)), int(match.group(2) or 0)


def _layer_file(layer: int, tp_rank: int) -> str:
    return f"layer_{layer:02d}-model_{tp_rank:02d}-model_states.pt"


def verify(step_dir: Path, manifest: Manifest) -> list[str]:
    """What is missing or empty among the files a GPT-NeoX checkpoint must hold."""
    tp, slices = int(manifest.run["tp"]), int(manifest.run["tp"]) * int(manifest.run["pp"])
    held: dict[int, set[int]] = {}
    for match in filter(None, map(_LAYER_FILE.match, manifest.files)):
        layer, rank = _layer_and_rank(match)
        held.setdefault(layer, set()).add(rank)
    needed = [model_file(s) for s in range(slices)]
    needed += [_layer_file(i, t) for i, ranks in sorted(held.items()) for t in range(tp)
               if t not in ranks]
    if manifest.contents.get("optimizer") and manifest.run["zero_stage"] in (1, 2):
        needed += [_optim_file(d, s) for s in range(slices)
                   for d in range(int(manifest.run.get("dp") or 1))]
    problems = [f"{step_dir / n}: missing (a GPT-NeoX checkpoint with model_parallel_size "
                f"{tp} has one per rank)" for n in needed if n not in manifest.files]
    return problems + [f"{step_dir / n}: empty" for n, entry in sorted(manifest.files.items())
                       if entry.size == 0]


def fill_from_run(manifest: Manifest, current: dict) -> Manifest:
    """`manifest` with the shape keys its checkpoint does not record taken from this run's
    (GPT-NeoX's converters save no config: the run's config describes the model)."""
    run = {**manifest.run, **{k: v for k, v in current.items()
                              if k in _SHAPE and manifest.run.get(k) is None}}
    return Manifest(manifest.iteration, manifest.tag, run, manifest.contents,
                    manifest.client_state, manifest.config, manifest.files, manifest.versions,
                    manifest.format_version)


_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
          "intermediate_size", "padded_vocab_size", "moe_expert_interval")


def architecture_args(run_args, config: dict, step_dir: Path):
    """`run_args` with the model keys GPT-NeoX saved in `config` (its configs/ files): the
    checkpoint's architecture. ValueError naming the checkpoint when they do not load here."""
    from dataclasses import fields

    names = {f.name for f in fields(type(run_args.model))}
    model_keys = {k: v for k, v in config.items() if k in names}
    if not model_keys:
        return run_args
    try:
        return run_args.replace(**model_keys)
    except ValueError as err:
        raise ValueError(f"the model keys GPT-NeoX saved in {Path(step_dir) / CONFIG_DIR} do not "
                         f"describe a model this project builds: {err}") from None


# --- reading tensors --------------------------------------------------------------------------

@dataclass(frozen=True)
class _Heads:
    """Attention geometry of one tensor rank (what the QKV reorder needs)."""

    heads: int | None
    kv_heads: int | None
    tp: int


def read_weights(step_dir: Path, manifest: Manifest, wanted: set[str] | None = None
                 ) -> dict[str, torch.Tensor]:
    """Our canonical full weights of the GPT-NeoX checkpoint (only `wanted` names if given)."""
    from megatron.model.config import GATED

    tp = int(manifest.run["tp"])
    activation = manifest.config.get("activation")
    if int(manifest.run.get("moe_num_experts") or 1) > 1 and activation in GATED:
        raise CheckpointMismatchError(
            f"{step_dir}: GPT-NeoX trained this mixture of experts with activation {activation}, "
            "which its experts (ParallelGroupedMLP) apply without a gate: a model this project "
            "does not build (its experts with a gated activation are gated, as Mixtral's)")
    per_rank = [_rank_tensors(step_dir, manifest.files, r) for r in range(tp)]
    return _canonical(per_rank, _heads(manifest), wanted)


def _rank_tensors(step_dir: Path, files, tp_rank: int) -> dict[int, dict]:
    """{GPT-NeoX layer index: {path: tensor}} of one tensor rank (pipeline or sequential);
    `files`: the checkpoint's file names."""
    names = {_layer_and_rank(m)[0]: m.group(0) for m in map(_LAYER_FILE.match, files)
             if m and _layer_and_rank(m)[1] == tp_rank}
    if names:
        return {i: dict(load_torch(step_dir / n, "cpu")) for i, n in sorted(names.items())}
    module = load_torch(step_dir / model_file(tp_rank), "cpu").get("module") or {}
    out: dict[int, dict] = {}
    for key, tensor in module.items():
        layer, path = _split_name(key, step_dir / model_file(tp_rank))
        out.setdefault(layer, {})[path] = tensor
    return out


def _split_name(name: str, where) -> tuple[int, str]:
    """(GPT-NeoX layer index, path) of a module or parameter name of GPT-NeoX's model."""
    match = re.match(r"^(?:sequential\.|module\.sequential\.)?(\d+)\.(.+)$", name)
    if match:
        return int(match.group(1)), match.group(2)
    match = re.match(r"^tied_modules\.embed\.(.+)$", name)
    if match:
        return 0, match.group(1)
    raise CheckpointMismatchError(f"{where}: tensor {name} is not part of GPT-NeoX's GPT model "
                                  "(expected sequential.<i>.*, <i>.* or tied_modules.embed.*)")


def _heads(manifest: Manifest) -> _Heads:
    run = manifest.run
    return _Heads(run.get("num_attention_heads"), run.get("num_kv_heads"), int(run["tp"]))


def _canonical(per_rank: list[dict[int, dict]], heads: _Heads, wanted: set[str] | None,
               exact: bool = True) -> dict[str, torch.Tensor]:
    """Per-rank GPT-NeoX layer tensors -> our canonical full tensors (merged over ranks;
    `exact`: replicated tensors must agree, see _merge)."""
    ours = [_to_ours(layers, heads) for layers in per_rank]
    mamba = any(p.startswith("mixer.") for layer in ours[0].values() for p in layer)
    if mamba and len(ours) > 1:
        raise CheckpointMismatchError(
            f"this GPT-NeoX checkpoint has Mamba layers saved by {len(ours)} tensor-parallel "
            "ranks: GPT-NeoX computes each rank's x_proj without summing over the ranks, so "
            "its layers are not the one-rank Mamba this project builds (docs/train.md, Mamba); "
            "only checkpoints of model_parallel_size 1 convert exactly")
    gated = any(_is_gated(layer) for layer in ours[0].values())
    sharding = Sharding(gated_mlp=gated)
    out = {}
    for index in sorted(ours[0]):
        parts = [rank[index] for rank in ours]
        if wanted is not None:
            parts = [{p: t for p, t in part.items() if f"{index}.{p}" in wanted} for part in parts]
        for path, tensor in _merge(sharding, parts, exact).items():
            out[f"{index}.{path}"] = tensor
    return out


def _is_gated(layer: dict) -> bool:
    up, down = layer.get("mlp.dense_h_to_4h.weight"), layer.get("mlp.dense_4h_to_h.weight")
    return up is not None and down is not None and up.shape[0] == 2 * down.shape[1]


def _to_ours(layers: dict[int, dict], heads: _Heads) -> dict[int, dict]:
    """One rank's GPT-NeoX layers -> {our layer index: {our path: tensor}} (renamed,
    reordered; GPT-NeoX's function slots and buffers dropped)."""
    out = {}
    for index, state in sorted(layers.items()):
        kept = {p: t for p, t in state.items() if not _DROPPED.search(p)}
        if not kept:
            continue
        kind = _kind(kept)
        ours = _rename(kept, heads.tp)
        if kind == "transformer":
            ours = _qkv_to_ours(ours, heads)
        unknown = sorted(set(ours) - _OURS[kind])
        if unknown:
            raise CheckpointMismatchError(
                f"GPT-NeoX layer {index} holds {', '.join(unknown)}, which this project's model "
                "does not have (RWKV and QK layernorm are not implemented)")
        out[{"embedding": 0, "transformer": index - 1, "mamba": index - 1}.get(kind, index - 2)] \
            = ours
    return out


def _kind(state: dict) -> str:
    if "word_embeddings.weight" in state:
        return "embedding"
    if any(p.startswith(("attention.", "mlp.")) for p in state):
        return "transformer"
    if any(p.startswith("mixer.") for p in state):
        return "mamba"
    if "final_linear.weight" in state:
        return "head"
    if any(p.startswith("norm.") for p in state):
        return "norm"
    raise CheckpointMismatchError(f"a GPT-NeoX layer holds {', '.join(sorted(state))}: not an "
                                  "embedding, transformer layer, final norm or output layer")


def _rename(state: dict, tp: int) -> dict:
    out = {}
    for path, tensor in state.items():
        if path in ("mlp.w1.weight", "mlp.w3.weight"):
            continue  # the older gated MLP: w3 (value) and w1 (gate) are linear1's two halves
        if path in (_EXPERT_W1, _EXPERT_W2):
            out.update(_experts_to_ours(state, path, tp))
            continue
        for pattern, repl in _RENAMES:
            path = pattern.sub(repl, path)
        out[path] = tensor
    if "mlp.w1.weight" in state:
        out["mlp.dense_h_to_4h.weight"] = torch.cat([state["mlp.w3.weight"],
                                                     state["mlp.w1.weight"]])
    return out


def _experts_to_ours(state: dict, path: str, tp: int) -> dict:
    """One rank's GPT-NeoX expert tensor `path` (w1 or w2, [n f, h]) as ours: w_in [n, f, h],
    w_out [n, h, f]; n = E / tp, E the router's rows (see the module docstring)."""
    router = state.get(_ROUTER)
    if router is None:
        raise CheckpointMismatchError(f"a GPT-NeoX layer holds {path} but no {_ROUTER}: its "
                                      "number of experts is unknown")
    experts, tensor = int(router.shape[0]), state[path]
    if experts % tp or tensor.dim() != 2 or tensor.shape[0] % (experts // tp):
        raise CheckpointMismatchError(
            f"GPT-NeoX's {path} {tuple(tensor.shape)} is not {experts} experts' rows split over "
            f"{tp} tensor-parallel ranks")
    blocks = tensor.reshape(experts // tp, -1, tensor.shape[1])  # [n, f, h]
    if path == _EXPERT_W1:
        return {"mlp.experts.w_in": blocks.clone()}
    return {"mlp.experts.w_out": blocks.transpose(1, 2).contiguous()}


def _qkv_to_ours(state: dict, heads: _Heads) -> dict:
    """GPT-NeoX's grouped-query QKV rows of one rank [q heads; k heads; v heads] -> our
    blocks per KV group [its q heads, k, v]. Without grouped-query attention both are
    [q, k, v] per head."""
    weight = state.get("attention.query_key_value.weight")
    if weight is None or heads.kv_heads is None or heads.kv_heads == heads.heads:
        if weight is not None and heads.heads is None:
            dense = state["attention.dense.weight"]
            if weight.shape[0] * heads.tp != 3 * dense.shape[0]:
                raise CheckpointMismatchError(
                    "the GPT-NeoX checkpoint uses grouped-query attention but records no "
                    "num_attention_heads: give the run's config the model's num_attention_heads "
                    "and num_kv_heads")
        return state
    q_local, kv_local = heads.heads // heads.tp, heads.kv_heads // heads.tp
    out = dict(state)
    for name in ("attention.query_key_value.weight", "attention.query_key_value.bias"):
        if name in state:
            t = state[name]
            head_dim = t.shape[0] // (q_local + 2 * kv_local)
            rest = tuple(t.shape[1:])
            q, k, v = t.split([q_local * head_dim, kv_local * head_dim, kv_local * head_dim])
            q = q.reshape(kv_local, q_local // kv_local, head_dim, *rest)
            k, v = (x.reshape(kv_local, 1, head_dim, *rest) for x in (k, v))
            out[name] = torch.cat([q, k, v], dim=1).reshape(t.shape)
    return out


def _merge(sharding: Sharding, parts: list[dict], exact: bool) -> dict:
    """Sharding.merge; without `exact`, a replicated tensor that differs between ranks (an
    optimizer moment that drifted in the last bits) is taken from rank 0."""
    if exact:
        return sharding.merge(parts)
    out = {}
    for path in parts[0]:
        try:
            out.update(sharding.merge([{path: p[path]} for p in parts]))
        except ValueError:
            out[path] = parts[0][path]
    return out


# --- the full state: weights, optimizer, schedule -----------------------------------------------

def read_state(step_dir: Path, manifest: Manifest, with_optimizer: bool,
               wanted: set[str] | None = None) -> dict:
    """The checkpoint as the fields of reshard.FullState: weights, LR schedule and engine
    counters, and with `with_optimizer` (where the checkpoint has readable state) the fp32
    masters and the optimizer's per-parameter tensors."""
    first = load_torch(step_dir / model_file(0), "cpu")
    state = {"weights": read_weights(step_dir, manifest, wanted),
             "lr_scheduler": first.get("lr_scheduler"),
             "counters": {k: first[k] for k in ("global_steps", "global_samples",
                                                "skipped_steps") if k in first}}
    if not (with_optimizer and manifest.contents.get("optimizer")):
        return state
    keys, per_rank, found = _optimizer_tensors(step_dir, manifest)
    merged = {key: _canonical(ranks, _heads(manifest), wanted, exact=False)
              for key, ranks in per_rank.items()}
    return {**state, "master": merged.pop("master", {}), "state_keys": keys,
            "state": {name: {k: merged[k][name] for k in keys} for name in merged[keys[0]]},
            "step": found.get("step")}


def _optimizer_tensors(step_dir: Path, manifest: Manifest):
    """(state keys, {"master"? | key: [per tensor rank {GPT-NeoX layer: {path: tensor}}]},
    found): each model-parallel slice's optimizer state through the layout it was saved in
    (optimizer_layouts): ZeRO 1/2 partitions named by DeepSpeed's param_shapes, or without
    ZeRO a torch state dict in GPT-NeoX's parameter order."""
    from megatron.checkpointing.optimizer_layouts import by_name, saved_state_keys

    tp, pp = int(manifest.run["tp"]), int(manifest.run["pp"])
    per_rank: dict[str, list[dict]] = {}
    found: dict = {}
    keys = None
    for s in range(tp * pp):
        indexes = _slice_indexes(step_dir, manifest, s)
        keys = keys or saved_state_keys(step_dir, indexes[0])
        layout = by_name(indexes[0]["optimizer"])
        for name, values in layout.read(step_dir, indexes[0], indexes, keys, found):
            layer, path = _split_name(name, step_dir / model_file(s))
            for key, tensor in values.items():
                ranks = per_rank.setdefault(key, [{} for _ in range(tp)])
                ranks[s % tp].setdefault(layer, {})[path] = tensor
    return keys, per_rank, found


def _slice_indexes(step_dir: Path, manifest: Manifest, s: int) -> list[dict]:
    """Shard-index entries (shard_index.py's form) for model-parallel slice `s`: one per
    data-parallel partition for ZeRO 1/2, one for a torch optimizer's state dict."""
    tp, dp = int(manifest.run["tp"]), int(manifest.run.get("dp") or 1)
    model = load_torch(step_dir / model_file(s), "cpu")
    entry = {"pipe": s // tp, "model": s % tp, "model_file": model_file(s)}
    if manifest.run["zero_stage"] in (1, 2):
        groups = [[[n, list(shape)] for n, shape in g.items()] for g in model["param_shapes"]]
        return [{**entry, "rank": s * dp + d, "data": d, "optimizer": "flat",
                 "optimizer_file": _optim_file(d, s), "groups": groups} for d in range(dp)]
    groups = _torch_groups(_rank_tensors(step_dir, manifest.files, s), model["optimizer"])
    return [{**entry, "rank": s, "data": 0, "optimizer": "torch", "groups": groups}]


def _torch_groups(layers: dict[int, dict], saved: dict) -> list[list] | None:
    """[[name, shape], ...] per group of the torch optimizer GPT-NeoX built for these layers
    (get_params_for_weight_decay_optimization: modules in order; norms' parameters, biases and
    the parameters it marks _no_weight_decay (Mamba's A_log, D) in the no-decay group, the rest
    in the decay group; one group when weight_decay was 0), or None when that order does not
    fit the saved groups' sizes and state shapes."""
    params = [(f"{i}.{p}", tuple(t.shape)) for i, state in sorted(layers.items())
              for p, t in state.items() if not _DROPPED.search(p)]
    no_decay = [(n, s) for n, s in params if n.rsplit(".", 1)[-1] == "bias"
                or _NORMS.search(n) or _NO_WEIGHT_DECAY.search(n)]
    decay = [item for item in params if item not in no_decay]
    groups = [decay, no_decay] if len(saved["param_groups"]) == 2 else [params]
    sizes = [len(g["params"]) for g in saved["param_groups"]]
    if [len(g) for g in groups] != sizes:
        return None
    for group, saved_group in zip(groups, saved["param_groups"]):
        for (_, shape), idx in zip(group, saved_group["params"]):
            held = saved["state"].get(idx, {})
            if any(isinstance(v, torch.Tensor) and v.dim() and tuple(v.shape) != shape
                   for v in held.values()):
                return None
    return [[[n, list(s)] for n, s in g] for g in groups]


def _optim_file(dp_rank: int, slice_rank: int) -> str:
    return f"zero_pp_rank_{dp_rank}_mp_rank_{slice_rank:02d}_optim_states.pt"
