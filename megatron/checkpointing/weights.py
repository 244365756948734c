"""Reading a checkpoint's tensors back as full (un-sharded) canonical tensors, whatever tensor /
pipeline layout and ZeRO stage wrote it: the model weights (what generation, eval, export and
resharding read) and each parameter's optimizer tensors (through the optimizer layout the
shard index names, see optimizer_layouts.py).

Canonical names are `<layer index>.<parameter path>` (see megatron.model.partition). The
tensor-parallel degree and the split of every tensor come from the checkpoint's own manifest
(its recorded `tp` and the activation in its saved config).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from megatron.checkpointing import neox_format, optimizer_layouts, shard_index
from megatron.checkpointing.manifest import Manifest, read_manifest
from megatron.model.partition import Sharding, canonical_from_module, is_expert_weight


def saved_sharding(manifest: Manifest) -> Sharding:
    """How the checkpoint's tensors are split over its tensor-parallel ranks."""
    return Sharding.for_activation(manifest.config.get("activation", "gelu"))


def full_weights(step_dir: Path, layers: set[int] | None = None,
                 manifest: Manifest | None = None) -> dict[str, torch.Tensor]:
    """Canonical full weights of the checkpoint in `step_dir` (any tp/pp; ZeRO-3 included);
    with `layers`, pipeline checkpoints read only those layers' files."""
    manifest = manifest or read_manifest(step_dir)
    if neox_format.is_neox(manifest):
        found = neox_format.read_weights(step_dir, manifest)
        return {k: v for k, v in found.items() if layers is None or int(k.split(".")[0]) in layers}
    tp, sharding = int(manifest.run.get("tp") or 1), saved_sharding(manifest)
    layer_files = sorted(step_dir.glob("layer_*-model_*-model_states.pt"))
    if layer_files:
        layer_files = [f for f in layer_files if layers is None or _layer_of(f) in layers]
        by_layer: dict[int, dict[int, dict]] = {}
        for f in layer_files:
            layer, rank = map(int, re.match(r"layer_(\d+)-model_(\d+)", f.name).groups())
            by_layer.setdefault(layer, {})[rank] = torch.load(f, map_location="cpu")
        out = {}
        for layer, ranks in sorted(by_layer.items()):
            merged = sharding.merge([ranks[r] for r in range(tp)])
            out.update({f"{layer}.{k}": v for k, v in merged.items()})
        return out
    if manifest.run.get("zero_stage") == 3:
        return _zero3_weights(step_dir, manifest, tp, sharding)
    per_rank = [torch.load(step_dir / f"mp_rank_{r:02d}_model_states.pt", map_location="cpu",
                           weights_only=False)["module"] for r in range(tp)]
    modules = [canonical_from_module(sd) for sd in per_rank]
    out = {}
    for name in modules[0]:
        layer, path = name.split(".", 1)
        out[name] = sharding.merge([{path: m[name]} for m in modules])[path]
    return out


def _zero3_weights(step_dir: Path, manifest: Manifest, tp: int, sharding: Sharding
                   ) -> dict[str, torch.Tensor]:
    """ZeRO stage 3 keeps the weights only as the optimizer's fp32 partitions: read them
    through the shard index (any tensor-parallel degree), else through DeepSpeed's own
    zero_to_fp32 (one model-parallel rank only)."""
    indexes = shard_index.load_all(step_dir, manifest.files)
    if indexes and all(i["optimizer"] == "zero3" for i in indexes):
        found = optimizer_tensors(step_dir, indexes, tp, sharding, None, {})
        return {name: merged["master"] for name, merged in found}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(step_dir.parent), tag=step_dir.name)
    return canonical_from_module(state)


def optimizer_tensors(step_dir: Path, indexes: list[dict], tp: int, sharding: Sharding,
                      wanted: set[str] | None, found: dict, keys: tuple[str, ...] | None = None):
    """(canonical name, {"master"?, <declared state key>: tensor}) merged over tensor ranks;
    the step count goes into `found["step"]`. `keys`: the state tensors to read (default: what
    the index declares)."""
    keys = shard_index.state_keys(indexes[0]) if keys is None else keys
    ep = int(indexes[0].get("ep", 1))  # expert parallelism: data ranks 0 .. ep-1 hold the experts
    shards: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for index in (i for i in indexes if i["data"] < ep):
        held = {name for group in index["groups"] for name, _ in group}
        if wanted is not None and not held & wanted:
            continue  # another pipeline stage's files
        layout = optimizer_layouts.by_name(index["optimizer"])
        for name, values in layout.read(step_dir, index, indexes, keys, found):
            if wanted is not None and name not in wanted:
                continue
            if not is_expert_weight(name):
                if index["data"] == 0:
                    shards.setdefault(name, {}).setdefault(index["model"], values)
                continue
            # tensor rank t, expert rank q hold block t * ep + q of the experts (model/moe.py)
            shards.setdefault(name, {}).setdefault(index["model"] * ep + index["data"], values)
    for name, per_rank in shards.items():
        yield name, _merge(name, [per_rank[r] for r in sorted(per_rank)], sharding)


def _merge(name: str, per_rank: list[dict[str, torch.Tensor]], sharding: Sharding
           ) -> dict[str, torch.Tensor]:
    """One parameter's optimizer tensors merged over tensor-parallel ranks (rank 0's copy for
    a replicated parameter)."""
    path = name.split(".", 1)[1]
    out = {}
    for key in per_rank[0]:
        try:
            out[key] = sharding.merge([{path: r[key]} for r in per_rank])[path]
        except ValueError:  # replicated state that drifted in the last bits between ranks
            out[key] = per_rank[0][key]
    return out


def _layer_of(path: Path) -> int:
    return int(re.match(r"layer_(\d+)-", path.name).group(1))
