"""Reading a checkpoint's weights for generation, eval and export: verified, full, canonical.

    ck = read_checkpoint(args.checkpoint.load, args.checkpoint.iteration)
    ck.canonical   # {"<layer>.<path>": full tensor}, whatever tp / pp / ZeRO layout saved them
    ck.saved_args  # the saving run's resolved config (its config.yml)
    config = ck.saved_model_config(args, ck.trained_vocab)   # the checkpoint's architecture

A checkpoint GPT-NeoX wrote (no manifest, see neox_format) is read the same way; its
architecture is the run config with the model keys of the configs GPT-NeoX saved beside it
(the run config alone when it saved none, as from GPT-NeoX's converters).

The checkpoint is `<load>/global_step<N>/` (N from `iteration`, else the tag `<load>/latest`
names; locate.step_directory). Every file is checked against the manifest's sizes and sha256
first (locate.open_verified): a damaged checkpoint is refused with each bad file named. The
caller shards the canonical tensors for its own tensor-parallel degree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from megatron.checkpointing.layout import CONFIG_NAME, iteration_of
from megatron.checkpointing import neox_format
from megatron.checkpointing.locate import checkpoint_dir, open_verified
from megatron.checkpointing.model_shape import (describe_shape, position_table_warning,
                                                reward_model_refusal)
from megatron.checkpointing.weights import full_weights
from megatron.monitoring.logger import get_logger, global_rank


@dataclass(frozen=True)
class CheckpointWeights:
    """A checkpoint's full weights and what its saved config says about them."""

    step_dir: Path
    iteration: int | None
    tensor_parallel: int
    canonical: dict[str, torch.Tensor]
    saved_args: object  # the saving run's NeoXArgs (None for a GPT-NeoX checkpoint)
    neox_config: dict | None = None  # a GPT-NeoX checkpoint's saved configs, merged

    @property
    def trained_vocab(self) -> int:
        """Rows of the embedding in the checkpoint (its padded vocabulary)."""
        return int(self.canonical["0.word_embeddings.weight"].shape[0])

    def language_model(self, what: str) -> None:
        """Refuse a reward model's checkpoint (a value head, no LM head) for `what` needs
        next-token logits."""
        saved = self.saved_args
        if saved is not None and saved.training.train_impl == "rm":
            raise ValueError(reward_model_refusal(self.step_dir, what))

    def saved_model_config(self, run_args, padded_vocab_size: int):
        """The ModelConfig of the checkpoint's own architecture (see the module docstring)."""
        from megatron.model.config import model_config_from_args

        saved = self.saved_args
        if saved is None:
            saved = neox_format.architecture_args(run_args, self.neox_config or {}, self.step_dir)
        return model_config_from_args(saved, padded_vocab_size)


def read_checkpoint(load: str | Path | None, iteration: int | None = None,
                    run_args=None) -> CheckpointWeights:
    """Full canonical weights of the chosen checkpoint (verified), with its saved config.
    `load` is a save directory or a global_step<N> directory; `run_args` (the reading run's
    config) supplies the shape a GPT-NeoX checkpoint without saved configs does not record."""
    from megatron.neox_arguments import NeoXArgs

    step_dir = checkpoint_dir(str(load) if load else None, iteration)
    manifest = open_verified(step_dir)
    if neox_format.is_neox(manifest):
        if run_args is not None:
            manifest = neox_format.fill_from_run(manifest, describe_shape(run_args, None))
        return CheckpointWeights(step_dir, manifest.iteration, int(manifest.run["tp"]),
                                 full_weights(step_dir, manifest=manifest), None,
                                 manifest.config)
    config_path = step_dir / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} is missing: the checkpoint does not record the "
                                "config it was saved with, so its tensor-parallel layout is "
                                "unknown")
    saved = NeoXArgs.from_yml_saved(config_path)
    note = position_table_warning(saved.model.pos_emb, manifest.run, step_dir)
    if note and global_rank() == 0:
        get_logger(__name__).warning("%s", note)
    canonical = full_weights(step_dir, manifest=manifest)
    tp = int(manifest.run.get("tp") or 1)
    return CheckpointWeights(step_dir, iteration_of(step_dir.name), tp, canonical, saved)


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
