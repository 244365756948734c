"""DeepSpeed's optimizer state layouts as objects; the one module that touches DeepSpeed's
optimizer internals (private attributes and the keys of its optimizer files, and the gradient
fragments `held_gradient` reads for log_grad_norm).

A layout knows how one kind of optimizer holds its per-parameter state, in memory and on disk:

    "torch"  a plain torch optimizer (fp32, ZeRO 0): `optimizer.state[param]`, saved in the
             model file's "optimizer" state dict, indexed by parameter order
    "master_copy"  DeepSpeed's fp16 wrapper without ZeRO (fp16, or bf16 without pipeline
             stages): an fp32 master copy of every parameter and the torch optimizer's state
             keyed by it, both in the model file's "optimizer" entry
    "flat"   DeepSpeed's bf16 optimizer or ZeRO stage 1/2: each parameter group laid end to end
             in one fp32 buffer, split into equal parts over the data-parallel ranks; each
             rank's part (master copy and the base optimizer's state) in its optimizer file
    "zero3"  ZeRO stage 3: every parameter split into ceil(numel / dp) parts (the last padded),
             rank d's parts of a group end to end in its optimizer file
    "none"   no optimizer state (no_save_optim, or no optimizer)

Each layout can `detects(optimizer)`, list its parameter `groups` in buffer order (what the
shard index records), `read` one model-parallel rank's saved state as per-parameter tensors
(merged over data-parallel ranks), and `place` one rank's part of layout-free state into a
live optimizer. Which state tensors an optimizer keeps per parameter is declared by the
optimizer registry (`state_keys`: Adam's exp_avg and exp_avg_sq, SGD's momentum_buffer); a
layout reads and places exactly those, plus the fp32 master copy where there is one.

Every DeepSpeed attribute goes through `_internal`, which names the DeepSpeed version found and
the one this code reads when the attribute is missing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import torch

from megatron.checkpointing.durable import load_torch
from megatron.checkpointing.errors import CheckpointMismatchError

SUPPORTED_DEEPSPEED = "0.19"
_FP32_MASTER_ATTRS = ("single_partition_of_fp32_groups", "fp32_groups_flat_partition",
                      "fp32_partitioned_groups_flat")


def _internal(obj, name: str):
    """`obj.name`, a DeepSpeed internal; a RuntimeError naming both versions when missing."""
    try:
        return getattr(obj, name)
    except AttributeError:
        import deepspeed

        raise RuntimeError(
            f"DeepSpeed {deepspeed.__version__} has no {type(obj).__name__}.{name}: checkpoint "
            f"saving, resharding and log_grad_norm read DeepSpeed {SUPPORTED_DEEPSPEED}.x "
            "optimizer internals. "
            f"Install deepspeed>={SUPPORTED_DEEPSPEED},<0.20 (requirements/requirements.txt)"
        ) from None


# --- parameters and file names ------------------------------------------------------------

def full_shape(param: torch.Tensor) -> torch.Size:
    """A parameter's (tensor-parallel shard) shape; ZeRO 3 keeps it beside an empty tensor."""
    return torch.Size(getattr(param, "ds_shape", param.shape))


def stored_tensor(param: torch.Tensor) -> torch.Tensor:
    """What this rank stores of a parameter: ZeRO 3's partition, else the parameter."""
    return getattr(param, "ds_tensor", param)


def full_value(param: torch.Tensor) -> torch.Tensor:
    """A copy of a parameter's whole (tensor-parallel shard) value; ZeRO 3 gathers it first."""
    if hasattr(param, "ds_tensor"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([param]):
            return param.detach().clone()
    return param.detach().clone()


def held_gradient(param: torch.Tensor) -> tuple[torch.Tensor | None, bool]:
    """The part of `param`'s gradient this rank holds between the last backward and the
    optimizer step, and whether the other data-parallel ranks hold the rest (so that the
    squares of the parts add up over them); (None, False) without a gradient.

    ZeRO 3: this rank's fp32 partition. ZeRO 1/2 and the bf16 optimizer: this rank's fragment
    of the fp32 gradient partition (possibly empty). Otherwise the whole `param.grad`.
    """
    if hasattr(param, "ds_id"):
        from deepspeed.utils import safe_get_local_grad

        return safe_get_local_grad(param), True
    if hasattr(param, "_hp_mapping"):
        mapping = param._hp_mapping
        if mapping is None:  # none of this parameter lies in this rank's partition
            return torch.zeros(0, device=param.device), True
        index = _internal(param, "_index_in_param_group")
        grad = _internal(mapping, "get_lp_grad_fragment")(index).reshape(-1)
        if grad.numel() == param.numel():  # the bf16 optimizer accumulates whole gradients
            address = _internal(mapping, "lp_fragment_address")
            grad = grad.narrow(0, address.start, address.numel)
        return grad, True
    return param.grad, False


def model_file_name(ds, root: Path, tag: str) -> str:
    """DeepSpeed's name of this rank's model-states file in checkpoint `tag`."""
    return os.path.basename(_internal(ds, "_get_ckpt_name")(str(root), tag))


def optimizer_file_path(ds, root: Path, tag: str) -> str:
    """DeepSpeed's path of this rank's optimizer-partition file in checkpoint `tag`."""
    return _internal(ds, "_get_zero_ckpt_name")(str(root), tag)


def optimizer_file_name(ds, root: Path, tag: str) -> str:
    return os.path.basename(optimizer_file_path(ds, root, tag))


def hide_optimizer_from_save(ds, hidden: bool):
    """(optimizer, save_zero_checkpoint) before the change; with `hidden`, DeepSpeed's save
    writes no optimizer state. Give the returned pair to `restore_optimizer`."""
    saved = ds.optimizer, _internal(ds, "save_zero_checkpoint")
    if hidden:
        ds.optimizer, ds.save_zero_checkpoint = None, False
    return saved


def restore_optimizer(ds, saved) -> None:
    ds.optimizer, ds.save_zero_checkpoint = saved


def partitions_weights(ds) -> bool:
    """ZeRO stage 3: the weights live in the optimizer's partitions."""
    return bool(ds.zero_optimization_partition_weights())


# --- the bf16 optimizer without ZeRO: DeepSpeed 0.19's load misses this rank's partition -----

def is_bf16_wrapper(optimizer) -> bool:
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    return isinstance(optimizer, BF16_Optimizer)


def load_bf16_partition(ds, root: Path, tag: str) -> None:
    """Load this data-parallel rank's BF16_Optimizer partition (fp32 master + state)."""
    import torch.distributed as dist

    from megatron.checkpointing.errors import CheckpointError

    path = optimizer_file_path(ds, root, tag)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is missing: the checkpoint has no bf16 optimizer partition "
                              "for this data-parallel rank")
    state = ds.checkpoint_engine.load(path, map_location="cpu")["optimizer_state_dict"]
    dp_rank = dist.get_rank(group=_internal(ds.optimizer, "dp_process_group"))
    per_rank = [None] * dp_rank + [state]
    ds.optimizer.load_state_dict(per_rank, load_optimizer_states=True, load_from_fp32_weights=True)


def refresh_masters(optimizer) -> None:
    """The bf16 optimizer's fp32 master copies from the (just loaded) module weights."""
    _internal(optimizer, "refresh_fp32_params")()


def master_tensors(optimizer) -> list:
    """The fp32 master partitions an optimizer wrapper holds (for size estimates)."""
    return [getattr(optimizer, a) for a in _FP32_MASTER_ATTRS if hasattr(optimizer, a)]


def partitioned(optimizer) -> bool:
    """Whether the optimizer state is split over data-parallel ranks (ZeRO or bf16 wrapper)."""
    return hasattr(optimizer, "dp_process_group")


# --- the layouts -----------------------------------------------------------------------------

class Layout:
    """One way an optimizer holds per-parameter state (see the module docstring)."""

    name = "none"

    def detects(self, optimizer) -> bool:
        return optimizer is None

    def groups(self, optimizer) -> list[list]:
        return []

    def read(self, step_dir: Path, index: dict, indexes: list[dict], keys: tuple[str, ...],
             found: dict) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
        raise CheckpointMismatchError(
            f"cannot reshard the optimizer state of {step_dir}: rank {index['rank']} saved none "
            "(no_save_optim). Load it with no_load_optim=true")

    def place(self, optimizer, params, full, tp, sharding, with_state: bool) -> None:
        """Nothing to place: the caller copies the weights into the parameters."""


class TorchLayout(Layout):
    name = "torch"

    def detects(self, optimizer) -> bool:
        return hasattr(optimizer, "param_groups") and not partitioned(optimizer)

    def groups(self, optimizer) -> list[list]:
        return [g["params"] for g in optimizer.param_groups]

    def read(self, step_dir, index, indexes, keys, found):
        saved = load_torch(step_dir / _state_file(index))["optimizer"]
        for group, saved_group in zip(index["groups"], saved["param_groups"]):
            for (name, _), idx in zip(group, saved_group["params"]):
                values = saved["state"].get(idx, {})
                _note_step(found, values)
                held = _declared(values, keys, f"{step_dir / index['model_file']} ({name})")
                if held:
                    yield name, held

    def place(self, optimizer, params, full, tp, sharding, with_state):
        if not with_state:
            return
        for name, p in params:
            _place_state(optimizer, p, name, full, tp, sharding)


class MasterCopyLayout(Layout):
    """DeepSpeed's fp16 wrapper without ZeRO (fp16, or bf16 without pipeline stages): every rank
    holds an fp32 master copy of each parameter and the torch optimizer's state keyed by it."""

    name = "master_copy"

    def detects(self, optimizer) -> bool:
        return (hasattr(optimizer, "fp16_groups") and hasattr(optimizer, "fp32_groups")
                and not partitioned(optimizer))

    def groups(self, optimizer) -> list[list]:
        return _internal(optimizer, "fp16_groups")

    def read(self, step_dir, index, indexes, keys, found):
        saved = load_torch(step_dir / _state_file(index))["optimizer"]
        inner = saved["optimizer_state_dict"]
        for g, (group, saved_group) in enumerate(zip(index["groups"], inner["param_groups"])):
            for j, ((name, shape), idx) in enumerate(zip(group, saved_group["params"])):
                values = inner["state"].get(idx, {})
                _note_step(found, values)
                held = _declared(values, keys, f"{step_dir / index['model_file']} ({name})")
                yield name, {"master": saved["fp32_groups"][g][j].view(shape), **held}

    def place(self, optimizer, params, full, tp, sharding, with_state):
        """Each parameter's fp32 master copy (the saved one, or from the weights) and, with
        `with_state`, the torch optimizer's state of it."""
        masters = {id(p): m for low, high in zip(_internal(optimizer, "fp16_groups"),
                                                 _internal(optimizer, "fp32_groups"))
                   for p, m in zip(low, high)}
        base = _internal(optimizer, "optimizer")
        for name, p in params:
            master = masters[id(p)]
            value = full.master.get(name, full.weights[name])
            master.data.copy_(sharding.local(value, name, tp))
            if with_state:
                _place_state(base, master, name, full, tp, sharding)


class FlatLayout(Layout):
    name = "flat"

    def detects(self, optimizer) -> bool:
        return hasattr(optimizer, "bf16_groups") or hasattr(optimizer, "bit16_groups")

    def groups(self, optimizer) -> list[list]:
        if hasattr(optimizer, "bf16_groups"):
            return optimizer.bf16_groups
        return getattr(optimizer, "round_robin_bit16_groups", None) or optimizer.bit16_groups

    def read(self, step_dir, index, indexes, keys, found):
        expert_groups = set(index.get("expert_groups", ()))
        files: dict = {}  # each file read once
        for g, group in enumerate(index["groups"]):
            if index["data"] > 0 and g not in expert_groups:
                continue  # (expert rank q > 0: only its experts are read from it)
            parts = _partition_files(step_dir, index, indexes, files, g in expert_groups)
            master = [p["single_partition_of_fp32_groups"][g] for p in parts]
            states = [_group_state(p["base_optimizer_state"], g) for p in parts]
            per_rank = _per_rank_state(step_dir, index, g, master, states, keys, found)
            flat = {k: torch.cat(v) for k, v in per_rank.items()}
            offset = 0
            for name, shape in group:  # the ranks' parts end to end: the group end to end
                numel = int(torch.Size(shape).numel())
                yield name, {k: v[offset:offset + numel].view(shape) for k, v in flat.items()}
                offset += numel
            _check_sizes(step_dir, index, g, group, master, zero3=False)

    def place(self, optimizer, params, full, tp, sharding, with_state):
        """Each parameter's fragment of this rank's fp32 partition: the master copy (from the
        saved one, or from the weights) and, with `with_state`, the optimizer's state."""
        base = _internal(optimizer, "optimizer")
        for name, p in params:
            mapping = getattr(p, "_hp_mapping", None)
            if mapping is None:
                continue  # none of this parameter lies in this data-parallel rank's partition
            lp, hp = mapping.lp_fragment_address, mapping.hp_fragment_address
            values = {"master": full.master.get(name, full.weights[name]),
                      **(full.state[name] if with_state else {})}
            flat_param = base.param_groups[mapping.param_group_index]["params"][0]
            for key, value in values.items():
                part = sharding.local(value, name, tp).flatten().narrow(0, lp.start, lp.numel)
                if key == "master":
                    mapping.hp_fragment.data.copy_(part)
                    continue
                target = _state_tensor(base, flat_param, key, full.step)
                target.narrow(0, hp.start, hp.numel).copy_(part)


class Zero3Layout(Layout):
    name = "zero3"

    def detects(self, optimizer) -> bool:
        return hasattr(optimizer, "fp32_partitioned_groups_flat")

    def groups(self, optimizer) -> list[list]:
        return _internal(optimizer, "fp16_groups")

    def read(self, step_dir, index, indexes, keys, found):
        parts = _partition_files(step_dir, index, indexes)
        for g, group in enumerate(index["groups"]):
            master = [p["fp32_flat_groups"][g] for p in parts]
            states = [p["optimizer_state_dict"]["state"][g] for p in parts]
            per_rank = _per_rank_state(step_dir, index, g, master, states, keys, found)
            dp, offset = len(master), 0
            for name, shape in group:  # every rank holds ceil(numel / dp) of each parameter
                numel = int(torch.Size(shape).numel())
                part = -(-numel // dp)
                yield name, {k: torch.cat([t[offset:offset + part] for t in v])[:numel].view(shape)
                             for k, v in per_rank.items()}
                offset += part
            _check_sizes(step_dir, index, g, group, master, zero3=True)

    def place(self, optimizer, params, full, tp, sharding, with_state):
        """This rank's part of every parameter (ceil(numel / dp) values, the last part padded
        with zeros) into the parameter's partition, the fp32 partition and the state."""
        import torch.distributed as dist

        positions = _internal(optimizer, "grad_position")
        flat_groups = _internal(optimizer, "fp32_partitioned_groups_flat")
        base = _internal(optimizer, "optimizer")
        for name, p in params:
            values = {"master": full.master.get(name, full.weights[name]),
                      **(full.state[name] if with_state else {})}
            group_pg = _internal(p, "ds_process_group")
            rank, world = dist.get_rank(group=group_pg), dist.get_world_size(group=group_pg)
            part = _internal(p, "ds_tensor").numel()
            group, offset, numel = positions[optimizer.get_param_id(p)]
            flat_param = flat_groups[group]
            for key, value in values.items():
                flat = sharding.local(value, name, tp).flatten()
                padded = torch.nn.functional.pad(flat, (0, part * world - flat.numel()))
                piece = padded[rank * part:(rank + 1) * part]
                if key == "master":
                    p.ds_tensor.data.copy_(piece)
                    target = flat_param
                else:
                    target = _state_tensor(base, flat_param, key, full.step)
                target.data.narrow(0, offset, numel).copy_(piece[:numel])


LAYOUTS: tuple[Layout, ...] = (FlatLayout(), Zero3Layout(), MasterCopyLayout(), TorchLayout())
NONE = Layout()


def detect(optimizer) -> Layout:
    """The layout of a live optimizer (DeepSpeed's wrapper or a torch optimizer)."""
    if optimizer is None:
        return NONE
    return next((layout for layout in LAYOUTS if layout.detects(optimizer)), NONE)


def by_name(name: str) -> Layout:
    """The layout a shard index names."""
    found = {layout.name: layout for layout in LAYOUTS}
    return found.get(name, NONE)


def saved_state_keys(step_dir: Path, index: dict) -> tuple[str, ...]:
    """The per-parameter tensors the optimizer that saved index's files kept (Adam: exp_avg,
    exp_avg_sq), read from the files themselves (for a checkpoint with no declaration, e.g.
    one GPT-NeoX wrote)."""
    if index["optimizer"] == "flat":
        part = load_torch(step_dir / index["optimizer_file"])["optimizer_state_dict"]
        values = _group_state(part["base_optimizer_state"], 0)
    else:
        values = next(iter(load_torch(step_dir / index["model_file"])["optimizer"]["state"]
                           .values()))
    return tuple(k for k, v in values.items() if isinstance(v, torch.Tensor) and k != "step")


# --- helpers shared by the layouts -------------------------------------------------------------

def _declared(values: dict, keys: tuple[str, ...], where: str) -> dict[str, torch.Tensor]:
    """The declared state tensors of one parameter; a tensor the declaration does not name is
    refused (resharding never drops state). {} when the optimizer has not stepped yet."""
    held = {k: v for k, v in values.items() if k != "step"}
    undeclared = sorted(k for k, v in held.items() if isinstance(v, torch.Tensor) and k not in keys)
    if undeclared:
        raise CheckpointMismatchError(
            f"{where}: the optimizer state holds {', '.join(undeclared)}, which the optimizer "
            f"that saved it does not declare (declared: {', '.join(keys) or 'none'}); resharding "
            "would lose it. Load at the saving layout, or declare it in the optimizer registry")
    if not held:
        return {}
    missing = [k for k in keys if k not in held]
    if missing:
        raise CheckpointMismatchError(
            f"{where}: the optimizer state lacks {', '.join(missing)}, which its optimizer "
            "declares; the files do not match their index")
    return {k: held[k] for k in keys}


def _place_state(optimizer, param: torch.Tensor, name: str, full, tp, sharding) -> None:
    """A torch optimizer's state of `param`: this rank's part of `name`'s declared tensors, and
    the saved step count."""
    state = optimizer.state[param]
    if full.step is not None:
        state["step"] = _step_tensor(optimizer, param, full.step)
    for key in full.state_keys:
        state[key] = sharding.local(full.state[name][key], name, tp).to(
            param.device, param.dtype).clone()


def _step_tensor(optimizer, param: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """A torch optimizer's step count for `param`: on the parameter's device for the fused and
    capturable kernels, which require it there, else on the CPU."""
    on_device = optimizer.defaults.get("fused") or optimizer.defaults.get("capturable")
    return step.clone().to(param.device) if on_device else step.clone()


def _note_step(found: dict, values: dict) -> None:
    if found.get("step") is None and "step" in values:
        found["step"] = torch.as_tensor(values["step"], dtype=torch.float32).detach().clone()


def _state_file(index: dict) -> str:
    """Where a torch or master-copy optimizer's state is: the model file, or under expert
    parallelism the rank's own file (expert_files.py)."""
    return index.get("optimizer_file") or index["model_file"]


def _partition_files(step_dir: Path, index: dict, indexes: list[dict], files: dict | None = None,
                     experts: bool = False) -> list[dict]:
    """The optimizer files of every data-parallel rank of this (pipeline, tensor) position;
    with `experts` (an expert group under expert parallelism), of those holding index's
    experts. `files`: those already read, by path (filled in)."""
    files = {} if files is None else files
    position = (index["pipe"], index["model"])
    same = sorted((i for i in indexes if (i["pipe"], i["model"]) == position
                   and (not experts or i.get("expert", 0) == index.get("expert", 0))),
                  key=lambda i: i["data"])
    for i in same:
        path = step_dir / i["optimizer_file"]
        if path not in files:
            files[path] = load_torch(path)["optimizer_state_dict"]
    return [files[step_dir / i["optimizer_file"]] for i in same]


def _per_rank_state(step_dir, index, g, master, states, keys, found) -> dict[str, list]:
    """{"master": [per dp rank], key: [per dp rank] for each declared key} of group g."""
    _note_step(found, states[0])
    where = f"{step_dir}: pipeline stage {index['pipe']}, tensor rank {index['model']}, group {g}"
    declared = [_declared(s, keys, where) for s in states]
    return {"master": master, **{k: [d[k] for d in declared] for k in keys if declared[0]}}


def _group_state(base: dict | list, g: int) -> dict:
    """Group g's state in DeepSpeed's saved base optimizer (a list per group for ZeRO, a torch
    state dict with one flat parameter per group for the bf16 optimizer)."""
    return base[g] if isinstance(base, list) else base["state"][g]


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


def _state_tensor(base, flat_param: torch.Tensor, key: str, step) -> torch.Tensor:
    """The base optimizer's `key` buffer for a flat fp32 partition, created (zeros, with the
    saved step) when the optimizer has not stepped yet."""
    state = base.state[flat_param]
    if key not in state:
        state[key] = torch.zeros_like(flat_param)
    if step is not None:
        state["step"] = step.clone()
    return state[key]
