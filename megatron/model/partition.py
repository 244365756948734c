"""How each weight is split over tensor-parallel ranks, and the model's canonical full state.

The canonical state dict names every tensor `<layer index>.<parameter path>`, where the layer
index is the position in `build_layer_specs` (0 embedding, 1..L transformer layers, L+1 final
norm, L+2 LM head; a tied LM head has no tensors of its own). Pipeline checkpoints store one
file per (layer, tensor rank); a plain module stores `layers.<i>.*` with tied layers once.
"""

from __future__ import annotations

import re

import torch

from megatron.mpu.layers import merge_shards

# parameter path (inside a layer) -> (dimension split over ranks, blocks laid end to end)
_SPLITS = (
    (re.compile(r"^attention\.query_key_value\.(weight|bias)$"), 0),
    (re.compile(r"^attention\.dense\.weight$"), 1),
    (re.compile(r"^mlp\.dense_h_to_4h\.(weight|bias)$"), 0),
    (re.compile(r"^mlp\.dense_4h_to_h\.weight$"), 1),
    (re.compile(r"^word_embeddings\.weight$"), 0),
    (re.compile(r"^weight$"), 0),  # the untied LM head
)


def split_of(param_path: str, gated_mlp: bool) -> tuple[int, int] | None:
    """(dim, stride_groups) for a tensor-parallel weight, or None for a replicated one."""
    for pattern, dim in _SPLITS:
        if pattern.match(param_path):
            groups = 2 if gated_mlp and param_path.startswith("mlp.dense_h_to_4h") else 1
            return dim, groups
    return None


def merge_tensor_parallel(per_rank: list[dict[str, torch.Tensor]], gated_mlp: bool
                          ) -> dict[str, torch.Tensor]:
    """One layer's full tensors from its tensor-parallel shards (rank order); replicated
    tensors must be equal on every rank."""
    merged = {}
    for path, first in per_rank[0].items():
        spec = split_of(path, gated_mlp)
        if spec is None or len(per_rank) == 1:
            for r, sd in enumerate(per_rank[1:], start=1):
                if not torch.equal(sd[path], first):
                    raise ValueError(f"replicated tensor {path} differs between tensor ranks 0 and {r}")
            merged[path] = first
        else:
            merged[path] = merge_shards([sd[path] for sd in per_rank], *spec)
    return merged


def canonical_from_module(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Canonical names for a plain `GPTModel` state dict: module i of `layers` is spec i (a tied
    LM head, the last spec, has no module of its own)."""
    out = {}
    for name, tensor in state_dict.items():
        match = re.match(r"^layers\.(\d+)\.(.+)$", name)
        if match is None:
            raise ValueError(f"unexpected tensor {name} in a GPTModel state dict")
        out[f"{int(match.group(1))}.{match.group(2)}"] = tensor
    return out


def canonical_param_name(module_name: str) -> str:
    """The canonical name of a parameter of the plain model (`layers.<i>.<path>`) or of a
    DeepSpeed PipelineModule (`<i>.<path>`, the tied embedding `tied_modules.embed.<path>`)."""
    match = re.match(r"^(?:layers\.)?(\d+)\.(.+)$", module_name)
    if match is not None:
        return f"{int(match.group(1))}.{match.group(2)}"
    match = re.match(r"^tied_modules\.embed\.(.+)$", module_name)
    if match is None:
        raise ValueError(f"parameter {module_name} is not part of the GPT model's layer specs")
    return f"0.{match.group(1)}"


def local_shard(full: torch.Tensor, name: str, tp, gated_mlp: bool) -> torch.Tensor:
    """Tensor-parallel view `tp`'s part of the canonical tensor `name` (replicated: itself)."""
    from megatron.mpu.layers import shard

    spec = split_of(name.split(".", 1)[1], gated_mlp)
    return full if spec is None else shard(full, spec[0], tp, spec[1])


def shard_canonical(full: dict[str, torch.Tensor], tp, gated_mlp: bool) -> dict[str, torch.Tensor]:
    """A `GPTModel` state dict for tensor-parallel view `tp` from canonical full tensors."""
    return {f"layers.{name}": local_shard(tensor, name, tp, gated_mlp)
            for name, tensor in full.items()}
