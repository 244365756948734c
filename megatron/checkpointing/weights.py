"""Reading a checkpoint's model weights back as full (un-sharded) canonical tensors, whatever
tensor/pipeline layout and ZeRO stage wrote it; the reader generation, eval and export use.

Canonical names are `<layer index>.<parameter path>` (see megatron.model.partition).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from megatron.model.partition import canonical_from_module, merge_tensor_parallel


def full_weights(step_dir: Path, tp: int, gated_mlp: bool = False,
                 layers: set[int] | None = None) -> dict[str, torch.Tensor]:
    """Canonical full state of the checkpoint in `step_dir` (any tp/pp; ZeRO-3 included);
    with `layers`, pipeline checkpoints read only those layers' files."""
    layer_files = sorted(step_dir.glob("layer_*-model_*-model_states.pt"))
    if layer_files:
        layer_files = [f for f in layer_files if layers is None or _layer_of(f) in layers]
        by_layer: dict[int, dict[int, dict]] = {}
        for f in layer_files:
            layer, rank = map(int, re.match(r"layer_(\d+)-model_(\d+)", f.name).groups())
            by_layer.setdefault(layer, {})[rank] = torch.load(f, map_location="cpu")
        out = {}
        for layer, ranks in sorted(by_layer.items()):
            merged = merge_tensor_parallel([ranks[r] for r in range(tp)], gated_mlp)
            out.update({f"{layer}.{k}": v for k, v in merged.items()})
        return out
    if list(step_dir.glob("zero_pp_rank_*_model_states.pt")) and _is_zero3(step_dir):
        from megatron.checkpointing.reshard import zero3_weights

        found = zero3_weights(step_dir, tp, gated_mlp)  # our shard index: any tp degree
        if found is not None:
            return found
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(step_dir.parent), tag=step_dir.name)
        return canonical_from_module(state)
    per_rank = [torch.load(step_dir / f"mp_rank_{r:02d}_model_states.pt", map_location="cpu",
                           weights_only=False)["module"] for r in range(tp)]
    modules = [canonical_from_module(sd) for sd in per_rank]
    out = {}
    for name in modules[0]:
        layer, path = name.split(".", 1)
        merged = merge_tensor_parallel([{path: m[name]} for m in modules], gated_mlp)
        out[name] = merged[path]
    return out


def _layer_of(path: Path) -> int:
    return int(re.match(r"layer_(\d+)-", path.name).group(1))


def _is_zero3(step_dir: Path) -> bool:
    state = torch.load(next(step_dir.glob("*zero_pp_rank_0_*optim_states.pt")), map_location="cpu",
                       weights_only=False)
    return state.get("ds_config", {}).get("zero_optimization", {}).get("stage") == 3
