"""Loading a checkpoint into another parallel layout: tensor, pipeline and data-parallel
degrees, ZeRO stage (0-3) and fp32/bf16 may all differ from the run that saved it.

    1. read: the saved files become full, layout-free state (FullState): canonical weights
       (`<layer>.<path>`, see megatron.model.partition), and per canonical name the fp32
       master copy and Adam's moments merged over the saved tensor-parallel shards and
       data-parallel partitions (each rank's shards/rank_<r>.json says what its files hold);
       the step count, LR schedule and engine counters
    2. place: every rank copies its own part into its engine: the weights into the module's
       parameters (ZeRO 3: their partitions), the moments into the torch optimizer's state or
       into its fragment of the flat fp32 buffers (DeepSpeed's per-parameter `_hp_mapping` for
       bf16 / ZeRO 1-2, `grad_position` for ZeRO 3)
Nothing is communicated: every rank reads the files of the layers it holds (all their
tensor-parallel shards and data-parallel partitions). Random generator
states are per rank of the old layout and are not carried over (they only drive dropout).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from megatron.checkpointing import shard_index
from megatron.checkpointing.durable import load_torch
from megatron.checkpointing.errors import CheckpointMismatchError
from megatron.checkpointing.manifest import Manifest
from megatron.checkpointing.weights import full_weights
from megatron.model.partition import canonical_param_name, local_shard, merge_tensor_parallel
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)

MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass
class FullState:
    """A checkpoint's state with no trace of the layout that wrote it."""

    weights: dict[str, torch.Tensor]
    master: dict[str, torch.Tensor] = field(default_factory=dict)  # fp32 copies (bf16, ZeRO)
    moments: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    step: torch.Tensor | None = None
    lr_scheduler: dict | None = None
    counters: dict = field(default_factory=dict)

    @property
    def has_optimizer(self) -> bool:
        return bool(self.moments)


def read_full_state(step_dir: Path, manifest: Manifest, gated_mlp: bool, with_optimizer: bool,
                    wanted: set[str] | None = None, required: bool = True) -> FullState:
    """The layout-free state of the checkpoint in `step_dir` (already verified); with
    `wanted` (canonical names), only the files holding those parameters are read. Optimizer
    state that cannot be read (no shard index) is an error when `required`, else skipped."""
    tp = int(manifest.run.get("tp") or 1)
    layers = None if wanted is None else {int(n.split(".", 1)[0]) for n in wanted}
    state = FullState(weights=full_weights(step_dir, tp, gated_mlp, layers))
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
    for name, merged in _optimizer_tensors(step_dir, indexes, state, tp, gated_mlp, wanted):
        if "master" in merged:
            state.master[name] = merged.pop("master")
        state.moments[name] = merged
    return state


def zero3_weights(step_dir: Path, tp: int, gated_mlp: bool, wanted: set[str] | None = None
                  ) -> dict[str, torch.Tensor] | None:
    """Canonical fp32 weights of a ZeRO stage 3 checkpoint (which keeps them only as the
    optimizer's partitions), any tensor-parallel degree; None without a shard index."""
    names = [p.relative_to(step_dir).as_posix() for p in step_dir.glob(
        f"{shard_index.INDEX_DIR}/*.json")]
    indexes = shard_index.load_all(step_dir, names)
    if not indexes or any(i["optimizer"] != "zero3" for i in indexes):
        return None
    found = _optimizer_tensors(step_dir, indexes, FullState(weights={}), tp, gated_mlp, wanted)
    return {name: merged["master"] for name, merged in found}


def _optimizer_tensors(step_dir: Path, indexes: list[dict], state: FullState, tp: int,
                       gated_mlp: bool, wanted: set[str] | None):
    """(canonical name, {"master"?, "exp_avg", "exp_avg_sq"}) merged over tensor ranks; the
    step count goes into `state`."""
    shards: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for index in (i for i in indexes if i["data"] == 0):
        held = {name for group in index["groups"] for name, _ in group}
        if wanted is not None and not held & wanted:
            continue  # another pipeline stage's files
        for name, values in _rank_optimizer_state(step_dir, index, indexes, state):
            if wanted is None or name in wanted:
                shards.setdefault(name, {}).setdefault(index["model"], values)
    for name, per_rank in shards.items():
        yield name, _merge(name, [per_rank[r] for r in range(tp)], gated_mlp)


def _merge(name: str, per_rank: list[dict[str, torch.Tensor]], gated_mlp: bool
           ) -> dict[str, torch.Tensor]:
    """One parameter's optimizer tensors merged over tensor-parallel ranks (rank 0's copy for
    a replicated parameter)."""
    layer, path = name.split(".", 1)
    out = {}
    for key in per_rank[0]:
        parts = [{path: r[key]} for r in per_rank]
        try:
            out[key] = merge_tensor_parallel(parts, gated_mlp)[path]
        except ValueError:  # replicated state that drifted in the last bits between ranks
            out[key] = per_rank[0][key]
    return out


def _rank_optimizer_state(step_dir: Path, index: dict, indexes: list[dict], state: FullState):
    """(canonical name, {"exp_avg", "exp_avg_sq"[, "master"]}) of one model-parallel rank."""
    if index["optimizer"] == "torch":
        saved = load_torch(step_dir / index["model_file"])["optimizer"]
        for group, saved_group in zip(index["groups"], saved["param_groups"]):
            for (name, _), idx in zip(group, saved_group["params"]):
                values = saved["state"].get(idx, {})
                if state.step is None and "step" in values:
                    state.step = _as_step(values["step"])
                if all(k in values for k in MOMENTS):
                    yield name, {k: values[k] for k in MOMENTS}
    elif index["optimizer"] in ("flat", "zero3"):
        yield from _partitioned_state(step_dir, index, indexes, state)
    else:
        raise CheckpointMismatchError(
            f"cannot reshard the optimizer state of {step_dir}: rank {index['rank']} saved none "
            "(no_save_optim). Load it with no_load_optim=true")


def _partitioned_state(step_dir: Path, index: dict, indexes: list[dict], state: FullState):
    """Each parameter's slices of the fp32 buffers of a bf16 / ZeRO 1-3 optimizer, from the
    files of every data-parallel rank of this (pipeline, tensor) position."""
    position = (index["pipe"], index["model"])
    same = sorted((i for i in indexes if (i["pipe"], i["model"]) == position),
                  key=lambda i: i["data"])
    parts = [load_torch(step_dir / i["optimizer_file"])["optimizer_state_dict"] for i in same]
    zero3 = index["optimizer"] == "zero3"
    for g, group in enumerate(index["groups"]):
        if zero3:
            master = [p["fp32_flat_groups"][g] for p in parts]
            group_states = [p["optimizer_state_dict"]["state"][g] for p in parts]
        else:
            master = [p["single_partition_of_fp32_groups"][g] for p in parts]
            group_states = [_group_state(p["base_optimizer_state"], g) for p in parts]
        if state.step is None and "step" in group_states[0]:
            state.step = _as_step(group_states[0]["step"])
        per_rank = {"master": master, **{k: [s[k] for s in group_states] for k in MOMENTS}}
        slicer = _zero3_slices if zero3 else _flat_slices
        for name, values in slicer(group, per_rank):
            yield name, values
        _check_sizes(step_dir, index, g, group, per_rank["master"], zero3)


def _flat_slices(group: list, per_rank: dict[str, list[torch.Tensor]]):
    """bf16 / ZeRO 1-2: the ranks' parts end to end are the group's parameters end to end."""
    flat = {k: torch.cat(v) for k, v in per_rank.items()}
    offset = 0
    for name, shape in group:
        numel = int(torch.Size(shape).numel())
        yield name, {k: v[offset:offset + numel].view(shape) for k, v in flat.items()}
        offset += numel


def _zero3_slices(group: list, per_rank: dict[str, list[torch.Tensor]]):
    """ZeRO 3: every rank holds ceil(numel / dp) of each parameter, in parameter order."""
    dp, offset = len(per_rank["master"]), 0
    for name, shape in group:
        numel = int(torch.Size(shape).numel())
        part = -(-numel // dp)
        yield name, {k: torch.cat([t[offset:offset + part] for t in v])[:numel].view(shape)
                     for k, v in per_rank.items()}
        offset += part


def _check_sizes(step_dir: Path, index: dict, g: int, group: list, master: list, zero3: bool):
    dp = len(master)
    numels = [int(torch.Size(shape).numel()) for _, shape in group]
    needed = sum(-(-n // dp) for n in numels) * dp if zero3 else sum(numels)
    held = sum(int(m.numel()) for m in master)
    if held < needed:
        raise CheckpointMismatchError(
            f"{step_dir}: the optimizer files of pipeline stage {index['pipe']}, tensor rank "
            f"{index['model']} hold {held} values in group {g}, fewer than its parameters' "
            f"{needed}: the files do not match their index")


def _as_step(value) -> torch.Tensor:
    """Adam's step count as torch keeps it (a float32 scalar tensor)."""
    return torch.as_tensor(value, dtype=torch.float32).detach().clone()


def _group_state(base: dict | list, g: int) -> dict:
    """Group g's state in DeepSpeed's saved base optimizer (a list per group for ZeRO, a torch
    state dict with one flat parameter per group for the bf16 optimizer)."""
    return base[g] if isinstance(base, list) else base["state"][g]


def local_names(engine) -> set[str]:
    """Canonical names of the parameters this rank's engine holds."""
    return {canonical_param_name(n) for n, _ in engine.engine.module.named_parameters()}


def place_full_state(engine, full: FullState, gated_mlp: bool, load_optimizer: bool,
                     load_lr_schedule: bool, load_counters: bool) -> None:
    """Copy this rank's part of `full` into the engine (weights always; the optimizer's
    moments and step with `load_optimizer`)."""
    ds = engine.engine
    params = [(canonical_param_name(n), p) for n, p in ds.module.named_parameters()]
    missing = sorted({name for name, _ in params} - set(full.weights))
    if missing:
        raise CheckpointMismatchError(
            f"the checkpoint has no weights for {', '.join(missing)}: this run's model differs "
            "from the checkpoint's (e.g. untied embeddings, no_weight_tying, where it tied "
            "them); use the model config the checkpoint was trained with")
    kind = shard_index.optimizer_kind(ds.optimizer)
    with_moments = load_optimizer and full.has_optimizer
    if kind == "zero3":
        _place_zero3(ds.optimizer, params, full, engine.tp, gated_mlp, with_moments)
    else:
        with torch.no_grad():
            for name, p in params:  # the fp32 master copy where there is one: the exact weights
                source = full.master.get(name, full.weights[name])
                p.copy_(local_shard(source, name, engine.tp, gated_mlp))
    if kind == "flat":
        _place_flat(ds.optimizer, params, full, engine.tp, gated_mlp, with_moments)
    elif kind == "torch" and with_moments:
        _place_torch(ds.optimizer, params, full, engine.tp, gated_mlp)
    if load_lr_schedule and full.lr_scheduler is not None and ds.lr_scheduler is not None:
        ds.lr_scheduler.load_state_dict(full.lr_scheduler)
    if load_counters:
        for key, value in full.counters.items():
            setattr(ds, key, value)


def _place_torch(optimizer, params, full: FullState, tp, gated_mlp: bool) -> None:
    for name, p in params:
        state = optimizer.state[p]
        state["step"] = full.step.clone()
        for key in MOMENTS:
            part = local_shard(full.moments[name][key], name, tp, gated_mlp)
            state[key] = part.to(p.dtype).clone()


def _place_flat(optimizer, params, full: FullState, tp, gated_mlp: bool, with_moments: bool):
    """Each parameter's fragment of this rank's fp32 partition: the master copy (from the
    saved one, or from the weights when there is none) and, with `with_moments`, the moments."""
    base = optimizer.optimizer
    for name, p in params:
        mapping = getattr(p, "_hp_mapping", None)
        if mapping is None:
            continue  # none of this parameter lies in this data-parallel rank's partition
        lp, hp = mapping.lp_fragment_address, mapping.hp_fragment_address
        master = full.master.get(name, full.weights[name])
        values = {"master": master, **(full.moments[name] if with_moments else {})}
        flat_param = base.param_groups[mapping.param_group_index]["params"][0]
        for key, value in values.items():
            part = local_shard(value, name, tp, gated_mlp).flatten().narrow(0, lp.start, lp.numel)
            if key == "master":
                mapping.hp_fragment.data.copy_(part)
                continue
            target = _flat_state_tensor(base, flat_param, key, full.step)
            target.narrow(0, hp.start, hp.numel).copy_(part)


def _place_zero3(optimizer, params, full: FullState, tp, gated_mlp: bool, with_moments: bool):
    """ZeRO 3: this rank's part of every parameter (ceil(numel / dp) values, the last part
    padded with zeros) into the parameter's partition, the fp32 partition and the moments."""
    import torch.distributed as dist

    for name, p in params:
        values = {"master": full.master.get(name, full.weights[name]),
                  **(full.moments[name] if with_moments else {})}
        rank = dist.get_rank(group=p.ds_process_group)
        part = p.ds_tensor.numel()
        group, offset, numel = optimizer.grad_position[optimizer.get_param_id(p)]
        flat_param = optimizer.fp32_partitioned_groups_flat[group]
        for key, value in values.items():
            flat = local_shard(value, name, tp, gated_mlp).flatten()
            padded = torch.nn.functional.pad(flat, (0, part * dist.get_world_size(
                group=p.ds_process_group) - flat.numel()))
            piece = padded[rank * part:(rank + 1) * part]
            if key == "master":
                p.ds_tensor.data.copy_(piece)
                target = flat_param
            else:
                target = _flat_state_tensor(optimizer.optimizer, flat_param, key, full.step)
            target.data.narrow(0, offset, numel).copy_(piece[:numel])


def _flat_state_tensor(base, flat_param: torch.Tensor, key: str, step) -> torch.Tensor:
    """The base optimizer's `key` buffer for a flat fp32 partition, created (zeros, with the
    saved step) when the optimizer has not stepped yet."""
    state = base.state[flat_param]
    if key not in state:
        state[key] = torch.zeros_like(flat_param)
    if step is not None:
        state["step"] = step.clone()
    return state[key]
