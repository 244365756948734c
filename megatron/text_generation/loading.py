"""Finding a checkpoint for generation/eval and reading its weights as full canonical tensors.

The checkpoint is `<load>/global_step<N>/` (N from the `iteration` key, else the tag in
`<load>/latest`); its `config.yml` (the saving run's resolved config) says the tensor-parallel
degree it was written with and the architecture it holds. `full_weights` merges any layout
(tp / pp / ZeRO) into canonical full tensors; the caller shards them for its own degree.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import torch

from megatron.checkpointing.layout import CONFIG_NAME, read_latest, saved_iterations, tag_for
from megatron.model.activations import GATED
from megatron.model.config import ModelConfig

# ModelConfig fields that must agree between the run config and the checkpoint's config;
# the rest (seq_length, dropout, init, seed, softmax precision) may differ at inference.
ARCHITECTURE_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "intermediate_size",
    "pos_emb", "rotary_pct", "rotary_emb_base", "norm", "norm_epsilon", "activation",
    "tied_embeddings", "gpt_j_residual", "gpt_j_tied", "use_bias_in_norms",
    "use_bias_in_attn_linear", "use_bias_in_mlp", "attention_types", "sliding_window_width",
)


@dataclass(frozen=True)
class CheckpointWeights:
    """A checkpoint's full weights and what its saved config says about them."""

    step_dir: Path
    iteration: int | None
    tensor_parallel: int
    canonical: dict[str, torch.Tensor]
    saved_args: object  # the saving run's NeoXArgs

    @property
    def trained_vocab(self) -> int:
        """Rows of the embedding in the checkpoint (its padded vocabulary)."""
        return int(self.canonical["0.word_embeddings.weight"].shape[0])


def checkpoint_dir(load: str | None, iteration: int | None) -> Path:
    """The step directory to read: `iteration`'s if given, else the one `latest` names."""
    if not load:
        raise ValueError("generation and evaluation read a trained checkpoint, but 'load' is not "
                         "set; set load to the directory the training run saved to")
    root = Path(load)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint directory {root} (config key 'load') does not exist")
    if iteration is None:
        tag = read_latest(root)
        if tag is None:
            found = ", ".join(tag_for(i) for i in saved_iterations(root)) or "none"
            raise FileNotFoundError(f"no checkpoint to load in {root}: it has no 'latest' file "
                                    f"(checkpoints found: {found}); set 'iteration' to pick one")
    else:
        tag = tag_for(iteration)
    step_dir = root / tag
    if not step_dir.is_dir():
        found = ", ".join(tag_for(i) for i in saved_iterations(root)) or "none"
        raise FileNotFoundError(f"checkpoint {step_dir} does not exist (checkpoints in {root}: "
                                f"{found})")
    return step_dir


def read_checkpoint(load: str | None, iteration: int | None) -> CheckpointWeights:
    """Full canonical weights of the chosen checkpoint, with its saved config."""
    from megatron.checkpointing.weights import full_weights
    from megatron.neox_arguments import NeoXArgs

    step_dir = checkpoint_dir(load, iteration)
    config_path = step_dir / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} is missing: the checkpoint does not record the "
                                "config it was saved with, so its tensor-parallel layout is "
                                "unknown")
    saved = NeoXArgs.from_yml_saved(config_path)
    tp = saved.parallelism.model_parallel_size
    gated = saved.model.activation in GATED
    canonical = full_weights(step_dir, tp, gated)
    number = step_dir.name.removeprefix("global_step")
    return CheckpointWeights(step_dir, int(number) if number.isdigit() else None, tp, canonical,
                             saved)


def architecture_mismatches(run: ModelConfig, saved: ModelConfig) -> list[str]:
    """`key: run value vs checkpoint value` for every architecture field that differs."""
    names = {f.name for f in fields(ModelConfig)}
    out = []
    for name in ARCHITECTURE_FIELDS:
        assert name in names, name
        a, b = getattr(run, name), getattr(saved, name)
        if a != b:
            out.append(f"{name}: {a!r} in this run's config vs {b!r} in the checkpoint's")
    if saved.pos_emb == "learned" and run.max_position_embeddings != saved.max_position_embeddings:
        out.append(f"max_position_embeddings (learned position table): "
                   f"{run.max_position_embeddings} vs {saved.max_position_embeddings}")
    return out


def check_architecture(run: ModelConfig, saved: ModelConfig, step_dir: Path) -> None:
    """Refuse a run config whose model differs from the checkpoint's (a clear error, not a
    shape mismatch deep inside load_state_dict)."""
    problems = architecture_mismatches(run, saved)
    if problems:
        raise ValueError(f"the model in this config differs from the checkpoint {step_dir} ("
                         + "; ".join(problems) + "); use the model config the checkpoint was "
                         "trained with")


def resize_vocab(canonical: dict[str, torch.Tensor], num_layers: int, rows: int
                 ) -> dict[str, torch.Tensor]:
    """The canonical weights with the embedding (and untied LM head) padded with zero rows to
    `rows` (needed when this run's tensor-parallel degree does not divide the checkpoint's
    padded vocabulary). Logits of the added rows are masked by the caller."""
    out = dict(canonical)
    for name in ("0.word_embeddings.weight", f"{num_layers + 2}.weight"):
        if name in out and out[name].shape[0] < rows:
            w = out[name]
            out[name] = torch.cat([w, w.new_zeros(rows - w.shape[0], *w.shape[1:])])
    return out
