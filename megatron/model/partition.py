"""How each weight is split over tensor-parallel ranks, and the model's canonical full state.

The canonical state dict names every tensor `<layer index>.<parameter path>`, where the layer
index is the position in `build_layer_specs` (0 embedding, 1..L transformer layers, L+1 final
norm, L+2 LM head; a tied LM head has no tensors of its own). Pipeline checkpoints store one
file per (layer, tensor rank); a plain module stores `layers.<i>.*` with tied layers once.

`Sharding` is the one description of the tensor-parallel split of a model, built from its
config (`Sharding.for_model(config)` or `Sharding.for_activation(name)`); checkpoint saving,
loading, resharding, conversion and generation all split and merge through it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from megatron.model.config import GATED
from megatron.mpu.layers import merge_shards

# parameter path (inside a layer) -> dimension split over ranks
_EXPERTS = re.compile(r"^mlp\.experts\.w_(in|out)$")


def is_expert_weight(name: str) -> bool:
    """Whether canonical `name` (`<layer>.<path>`) is an MoE layer's expert weight."""
    return bool(_EXPERTS.match(name.split(".", 1)[-1]))


_SPLITS = (
    (re.compile(r"^attention\.query_key_value\.(weight|bias)$"), 0),
    (re.compile(r"^attention\.dense\.weight$"), 1),
    (re.compile(r"^mlp\.dense_h_to_4h\.(weight|bias)$"), 0),
    (re.compile(r"^mlp\.dense_4h_to_h\.weight$"), 1),
    (_EXPERTS, 0),  # whole experts per rank
    # Mamba layers: channels split over ranks (megatron/model/mamba.py)
    (re.compile(r"^mixer\.in_proj\.(weight|bias)$"), 0),
    (re.compile(r"^mixer\.(conv1d|dt_proj)\.(weight|bias)$"), 0),
    (re.compile(r"^mixer\.(A_log|D)$"), 0),
    (re.compile(r"^mixer\.(x_proj|out_proj)\.weight$"), 1),
    (re.compile(r"^word_embeddings\.weight$"), 0),
    (re.compile(r"^weight$"), 0),  # the untied LM head
)
_GATED_UP = re.compile(r"^mlp\.dense_h_to_4h\.")  # [value; gate] blocks, each split apart
_MAMBA_IN = re.compile(r"^mixer\.in_proj\.")  # [x; z] blocks, each split apart


@dataclass(frozen=True)
class Split:
    """A tensor-parallel weight: split along `dim`, which holds `blocks` blocks laid end to end
    (each block split over the ranks separately)."""

    dim: int
    blocks: int = 1


@dataclass(frozen=True)
class Sharding:
    """How every canonical tensor of one model is split over tensor-parallel ranks."""

    gated_mlp: bool = False

    @classmethod
    def for_activation(cls, activation: str) -> "Sharding":
        return cls(gated_mlp=activation in GATED)

    @classmethod
    def for_model(cls, config) -> "Sharding":
        """From a ModelConfig (or anything with the model's `activation`)."""
        return cls.for_activation(config.activation)

    def split_of(self, param_path: str) -> Split | None:
        """The split of a tensor-parallel weight (its path inside a layer), or None for a
        replicated one."""
        for pattern, dim in _SPLITS:
            if pattern.match(param_path):
                two = (self.gated_mlp and _GATED_UP.match(param_path)) or _MAMBA_IN.match(param_path)
                return Split(dim, 2 if two else 1)
        return None

    def merge(self, per_rank: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """One layer's full tensors from its tensor-parallel shards (rank order); replicated
        tensors must be equal on every rank."""
        merged = {}
        for path, first in per_rank[0].items():
            split = self.split_of(path)
            if split is None or len(per_rank) == 1:
                for r, sd in enumerate(per_rank[1:], start=1):
                    if not torch.equal(sd[path], first):
                        raise ValueError(f"replicated tensor {path} differs between tensor ranks "
                                         f"0 and {r}")
                merged[path] = first
            else:
                merged[path] = merge_shards([sd[path] for sd in per_rank], split.dim, split.blocks)
        return merged

    def local(self, full: torch.Tensor, name: str, tp) -> torch.Tensor:
        """Tensor-parallel view `tp`'s part of the canonical tensor `name` (replicated:
        itself)."""
        from megatron.mpu.layers import shard

        path = name.split(".", 1)[1]
        split = self.split_of(path)
        if split is None:
            return full
        piece = shard(full, split.dim, tp, split.blocks)
        ep = getattr(tp, "ep", None)
        if ep is not None and ep.enabled and _EXPERTS.match(path):  # then over expert ranks
            count = piece.shape[0] // ep.size
            piece = piece.narrow(0, ep.rank * count, count)
        return piece

    def shard_model(self, full: dict[str, torch.Tensor], tp) -> dict[str, torch.Tensor]:
        """A `GPTModel` state dict for tensor-parallel view `tp` from canonical full tensors."""
        return {f"layers.{name}": self.local(tensor, name, tp) for name, tensor in full.items()}


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
