"""The reference model of DPO and KTO: a frozen copy of the model the run started from, which
scores every batch before the policy does.

    source = reference_source(args, resumed)            # where it is read from
    reference = build_reference(args, engine, model_config, source)  # None off the last stage
    inputs, targets = reference.fill(objective, inputs, targets)

Where it comes from: as GPT-NeoX, the checkpoint `load` names when the run starts (a fine-tune
from it). A run resumed from its own checkpoint reloads that same starting checkpoint, whose
path, iteration and manifest digest every checkpoint of the run records (`reference` in its
client state) - the intermediate policy never becomes the reference. A reference checkpoint
that has moved is read from `reference_load` once its iteration and manifest are those
recorded. Without `load` there is no model to compare with, and the run is refused
(dpo_reference_free needs none).

The reference is a plain (non-pipelined) model with the run's tensor-parallel split and dtype,
in eval mode, never stepped. With pipeline stages only the last stage, which computes the loss,
holds and runs it (the whole model: it is not split over the stages).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from megatron.monitoring.logger import get_logger
from megatron.training.reference_source import (SOURCE_KEY, gone_message,  # noqa: F401
                                                reference_source)

log = get_logger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ReferenceModel:
    """A frozen model whose per-token log-probabilities fill the targets' reference slot."""

    def __init__(self, model, tp, source: dict, fp32: bool = True):
        self.model, self.tp, self.source, self.fp32 = model, tp, source, fp32
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.model.eval()

    @torch.no_grad()
    def fill(self, objective, inputs: tuple, targets: tuple) -> tuple[tuple, tuple]:
        from megatron.training.objectives.common import token_logps

        logits = self.model(*inputs)
        return inputs, objective.with_reference(targets, token_logps(logits, targets[0], self.tp,
                                                                     self.fp32))


def build_reference(args, engine, model_config, source: dict) -> ReferenceModel | None:
    """This rank's reference model read from `source` (reference_source), or None on a
    pipeline stage other than the last. Collective: the checkpoint is verified by all ranks
    together, then each keeps what it needs."""
    weights = read_reference_weights(args, model_config, source)
    if engine.is_pipeline and not engine.engine.is_last_stage():
        return None
    device = next(engine.engine.module.parameters()).device
    model = _build_model(args, model_config, engine.tp, weights).to(device)
    log.info("reference model: %s (iteration %s), frozen", source["path"], source["iteration"])
    return ReferenceModel(model, engine.tp, source, getattr(engine.objective, "fp32", True))


def read_reference_weights(args, model_config, source: dict) -> dict:
    """The reference checkpoint's canonical weights, padded to this run's vocabulary."""
    from megatron.checkpointing.model_shape import check_architecture
    from megatron.checkpointing.reader import read_checkpoint, resize_vocab

    path = Path(source["path"])
    if not path.is_dir():
        raise FileNotFoundError(gone_message(path))
    ck = read_checkpoint(str(path), None, run_args=args)
    ck.language_model("a reference model")
    check_architecture(model_config, ck.saved_model_config(args, ck.trained_vocab), ck.step_dir)
    return resize_vocab(ck.canonical, model_config.num_layers, model_config.padded_vocab_size)


def _build_model(args, model_config, tp, weights: dict):
    """The reference model: no dropout, this rank's tensor-parallel shard, the run's dtype."""
    from megatron.model.gpt import GPTModel
    from megatron.model.partition import Sharding

    config = dataclasses.replace(model_config, hidden_dropout=0.0, attention_dropout=0.0)
    model = GPTModel(config, tp)
    model.load_state_dict(Sharding.for_model(config).shard_model(weights, tp), strict=True)
    return model.to(dtype=DTYPES[args.derived.precision])
