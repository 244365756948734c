"""Loading a checkpoint into another parallel layout: tensor, pipeline and data-parallel
degrees, ZeRO stage (0-3) and fp32/bf16 may all differ from the run that saved it.

    1. read: the saved files become full, layout-free state (FullState): canonical weights
       (`<layer>.<path>`, see megatron.model.partition), and per canonical name the fp32
       master copy and the optimizer's declared state tensors (Adam's moments, SGD's momentum
       buffer, ...) merged over the saved tensor-parallel shards and data-parallel partitions
       (each rank's shards/rank_<r>.json says what its files hold, in which optimizer layout);
       the step count, LR schedule and engine counters
    2. place: every rank copies its own part into its engine: the weights into the module's
       parameters and the rest through its optimizer's layout (optimizer_layouts.py)
Nothing is communicated: every rank reads the files of the layers it holds (all their
tensor-parallel shards and data-parallel partitions). Random generator states are per rank of
the old layout and are not carried over (they only drive dropout). Optimizer state that this
run's optimizer does not keep, or keeps and the checkpoint lacks, is refused by name: state is
never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from megatron.checkpointing import neox_format, optimizer_layouts, shard_index
from megatron.checkpointing.durable import load_torch
from megatron.checkpointing.errors import CheckpointMismatchError
from megatron.checkpointing.manifest import Manifest
from megatron.checkpointing.weights import full_weights, optimizer_tensors, saved_sharding
from megatron.model.partition import Sharding, canonical_param_name


@dataclass
class FullState:
    """A checkpoint's state with no trace of the layout that wrote it."""

    weights: dict[str, torch.Tensor]
    master: dict[str, torch.Tensor] = field(default_factory=dict)  # fp32 copies (bf16, ZeRO)
    state: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # declared tensors
    state_keys: tuple[str, ...] = ()
    step: torch.Tensor | None = None
    lr_scheduler: dict | None = None
    counters: dict = field(default_factory=dict)

    @property
    def has_optimizer(self) -> bool:
        return bool(self.state)


def read_full_state(step_dir: Path, manifest: Manifest, with_optimizer: bool = True,
                    wanted: set[str] | None = None, required: bool = True) -> FullState:
    """The layout-free state of the checkpoint in `step_dir` (already verified); with
    `wanted` (canonical names), only the files holding those parameters are read. Optimizer
    state that cannot be read (no shard index) is an error when `required`, else skipped."""
    if neox_format.is_neox(manifest):
        return FullState(**neox_format.read_state(step_dir, manifest, with_optimizer, wanted))
    layers = None if wanted is None else {int(n.split(".", 1)[0]) for n in wanted}
    state = FullState(weights=full_weights(step_dir, layers=layers, manifest=manifest))
    indexes = shard_index.load_all(step_dir, manifest.files)
    writers = [i for i in indexes if i["data"] == 0]
    if writers:
        model_file = load_torch(step_dir / min(writers, key=lambda i: i["rank"])["model_file"])
        state.lr_scheduler = model_file.get("lr_scheduler")
        state.counters = {k: model_file[k] for k in ("global_steps", "global_samples",
                                                      "skipped_steps") if k in model_file}
    if not with_optimizer or not (indexes or required):
        return state
    if not indexes:
        raise CheckpointMismatchError(
            f"cannot load the optimizer state of {step_dir} into another parallel layout: the "
            f"checkpoint has no {shard_index.INDEX_DIR}/ index (it was written by an older "
            "version). Load it with the layout that saved it, or with no_load_optim=true")
    state.state_keys = shard_index.state_keys(indexes[0])
    found: dict = {}
    tp = int(manifest.run.get("tp") or 1)
    for name, merged in optimizer_tensors(step_dir, indexes, tp, saved_sharding(manifest),
                                          wanted, found):
        if "master" in merged:
            state.master[name] = merged.pop("master")
        if merged:
            state.state[name] = merged
    state.step = found.get("step")
    return state


def local_names(engine) -> set[str]:
    """Canonical names of the parameters this rank's engine holds."""
    return {canonical_param_name(n) for n, _ in engine.engine.module.named_parameters()}


def initial_value(engine, name: str) -> torch.Tensor:
    """The engine's own (freshly initialised) full value of the replicated parameter `name`."""
    for module_name, param in engine.engine.module.named_parameters():
        if canonical_param_name(module_name) != name:
            continue
        return optimizer_layouts.full_value(param)
    raise KeyError(name)


def place_full_state(engine, full: FullState, sharding: Sharding, optimizer_state: tuple[str, ...],
                     load_optimizer: bool, load_lr_schedule: bool, load_counters: bool) -> None:
    """Copy this rank's part of `full` into the engine (weights always; the optimizer's state
    tensors and step with `load_optimizer`). `optimizer_state`: the tensors this run's
    optimizer keeps per parameter."""
    ds = engine.engine
    params = [(canonical_param_name(n), p) for n, p in ds.module.named_parameters()]
    missing = sorted({name for name, _ in params} - set(full.weights))
    if missing:
        raise CheckpointMismatchError(
            f"the checkpoint has no weights for {', '.join(missing)}: this run's model differs "
            "from the checkpoint's (e.g. untied embeddings, no_weight_tying, where it tied "
            "them); use the model config the checkpoint was trained with")
    with_state = load_optimizer and full.has_optimizer
    if with_state:
        _check_state_keys(full, optimizer_state)
    layout = optimizer_layouts.detect(ds.optimizer)
    if layout.name != "zero3":
        with torch.no_grad():
            for name, p in params:  # the fp32 master copy where there is one: the exact weights
                source = full.master.get(name, full.weights[name])
                p.copy_(sharding.local(source, name, engine.tp))
    layout.place(ds.optimizer, params, full, engine.tp, sharding, with_state)
    if load_lr_schedule and full.lr_scheduler is not None and ds.lr_scheduler is not None:
        ds.lr_scheduler.load_state_dict(full.lr_scheduler)
    if load_counters:
        for key, value in full.counters.items():
            setattr(ds, key, value)


def _check_state_keys(full: FullState, optimizer_state: tuple[str, ...]) -> None:
    """Refuse, naming them, state tensors the checkpoint holds that this run's optimizer would
    drop, or that it needs and the checkpoint lacks."""
    saved, wanted = set(full.state_keys), set(optimizer_state)
    if saved == wanted:
        return
    parts = []
    if saved - wanted:
        parts.append(f"the checkpoint holds {', '.join(sorted(saved - wanted))}, which this "
                     "run's optimizer does not keep")
    if wanted - saved:
        parts.append(f"this run's optimizer needs {', '.join(sorted(wanted - saved))}, which "
                     "the checkpoint does not hold")
    raise CheckpointMismatchError(
        "cannot carry the optimizer state into this run: " + "; ".join(parts) + ". Use the "
        "optimizer the checkpoint was trained with, or no_load_optim=true to start it fresh")
