"""Weights, optimizer and LR schedule: written and read through DeepSpeed's engine.

DeepSpeed keeps deciding which rank writes which file (model states on data-parallel rank 0,
one file per layer with pipelines, optimizer partitions per rank with ZeRO or bf16); we give it
`DurableCheckpointEngine`, which writes each file in one pass with its sha256, fsyncs it and
records it for the manifest. A write error is kept instead of raised, so that the rank still
joins DeepSpeed's collectives; the save is then aborted on all ranks together (save.py).

Three gaps of DeepSpeed 0.19 are filled here:
- no_save_optim: DeepSpeed always writes the optimizer; it is hidden from it for the call.
- bf16 without ZeRO: DeepSpeed's load hands the one saved state to an optimizer that indexes it
  by data-parallel rank (KeyError: 0); this rank's partition file
  `bf16_zero_pp_rank_<dp>_mp_rank_<mp>_optim_states.pt` is loaded instead.
- optimizer settings: DeepSpeed's load replaces the parameter groups' eps, betas, weight decay
  (...) with the checkpoint's; the config's are put back, as a load at another layout keeps
  them (reshard.py places state tensors only), and a difference is logged.
What they need of DeepSpeed's internals is in optimizer_layouts.py.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from pathlib import Path
from typing import Callable

import torch

from megatron.checkpointing import collectives, expert_files, optimizer_layouts
from megatron.checkpointing.durable import FileRecord, load_torch, write_torch
from megatron.checkpointing.errors import CheckpointError
from megatron.checkpointing.layout import read_latest
from megatron.monitoring.errors import describe_error, lost_peer
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)

_MARGIN = 1.1  # pickled metadata, DeepSpeed's bookkeeping


class DurableCheckpointEngine:
    """DeepSpeed's checkpoint-engine interface over durable, hashed writes (duck-typed)."""

    name = "DurableCheckpointEngine"

    def __init__(self):
        self.mapped: set[str] = set()  # checkpoint directories whose files back loaded tensors
        self.begin(Path("."))

    def begin(self, directory: Path, before_write: Callable[[Path], None] | None = None) -> None:
        """Start recording the files of one save into `directory`."""
        self.directory = Path(os.path.abspath(directory))
        self.records: dict[str, FileRecord] = {}
        self.error: str | None = None
        self._before_write = before_write

    def fail(self, where, err: BaseException) -> None:
        if self.error is None:
            self.error = f"{where}: {describe_error(err)}"

    def save(self, state_dict, path: str) -> None:
        if self.error is not None:
            return  # this save is already lost; write nothing more
        target = Path(os.path.abspath(path))
        try:
            if self._before_write is not None:
                self._before_write(target)
            record = write_torch(state_dict, target)
        except OSError as err:
            self.fail(f"writing {target}", err)
            return
        self.records[target.relative_to(self.directory).as_posix()] = record

    def makedirs(self, path, exist_ok: bool = False) -> None:
        try:
            os.makedirs(path, exist_ok=exist_ok)
        except OSError as err:
            self.fail(f"creating {path}", err)

    def load(self, path: str, map_location=None):
        # verified by load.py before DeepSpeed loads; tensors DeepSpeed keeps (optimizer state)
        # stay mapped from the file, so retention must not delete its directory (in_use)
        self.mapped.add(os.path.abspath(os.path.dirname(path)))
        return load_torch(path, map_location)

    def create(self, info) -> None:
        pass

    def commit(self, info) -> bool:
        return True

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return dp_rank == 0

    def is_decoupled(self) -> bool:
        return False

    def preserves_storage_sharing(self) -> bool:
        return True

    def cleanup(self) -> None:
        pass

    def get_commit_info(self):
        return None

    def set_commit_info(self, info) -> None:
        pass


def install(ds) -> DurableCheckpointEngine:
    """Give the DeepSpeed engine `ds` our checkpoint engine (once)."""
    current = getattr(ds, "checkpoint_engine", None)
    if isinstance(current, DurableCheckpointEngine):
        return current
    if current is not None and type(current).__name__ != "TorchCheckpointEngine":
        log.warning("DeepSpeed's %s is replaced by the durable checkpoint engine (checksums, "
                    "fsync, atomic commit); its own settings are ignored", type(current).__name__)
    ours = DurableCheckpointEngine()
    ds.checkpoint_engine = ours
    return ours


@contextlib.contextmanager
def _optimizer_hidden(ds, hide: bool):
    """Make DeepSpeed's save skip the optimizer state (no_save_optim)."""
    if not hide:
        yield
        return
    saved = optimizer_layouts.hide_optimizer_from_save(ds, hidden=True)
    try:
        yield
    finally:
        optimizer_layouts.restore_optimizer(ds, saved)


def save_engine_state(engine, root: Path, staging: str, client_state: dict, save_optimizer: bool,
                      before_write: Callable[[Path], None] | None = None
                      ) -> tuple[dict[str, FileRecord], str | None]:
    """DeepSpeed writes this rank's files into `root/staging`: (files written, first error).

    Collective. An exception escaping DeepSpeed's save on this rank is turned into the error,
    after joining the barrier DeepSpeed's save ends with, where the other ranks wait.
    """
    ds = engine.engine
    ours = install(ds)
    ours.begin(root / staging, before_write)
    try:
        with _optimizer_hidden(ds, hide=not save_optimizer), expert_files.checkpoint_view(engine):
            ds.save_checkpoint(str(root), tag=staging, client_state=client_state, save_latest=False)
        if save_optimizer:
            expert_files.save_extra_optimizer_state(engine, root / staging)
    except Exception as err:  # noqa: BLE001 - reported to every rank, then raised there
        if lost_peer(err):  # another rank died: gloo's traceback adds nothing to that
            log.error("DeepSpeed's save failed on this rank: %s", describe_error(err))
        else:
            log.error("DeepSpeed's save failed on this rank:\n%s", traceback.format_exc())
        ours.fail(f"DeepSpeed save_checkpoint into {root / staging}", err)
        collectives.barrier()
    return dict(ours.records), ours.error


def in_use(engine, root: Path) -> tuple[str, ...]:
    """Names of the checkpoint directories under `root` this process's loaded tensors map."""
    ours = getattr(engine.engine, "checkpoint_engine", None)
    mapped = ours.mapped if isinstance(ours, DurableCheckpointEngine) else set()
    return tuple(sorted(Path(d).name for d in mapped
                        if Path(d).parent == Path(os.path.abspath(root))))


def _tensor_bytes(values) -> int:
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
        elif isinstance(v, dict):
            total += _tensor_bytes(v.values())
        elif isinstance(v, (list, tuple)):
            total += _tensor_bytes(v)
    return total


def estimate_bytes(engine, save_optimizer: bool, zero_stage: int) -> int:
    """About how many bytes a checkpoint of this run takes: one replica of the parameters and
    the optimizer state (moments and fp32 master copies), plus 10%. Collective."""
    ds = engine.engine
    params = 0
    for p in ds.module.parameters():
        stored = optimizer_layouts.stored_tensor(p)  # ZeRO 3: this rank's partition
        params += stored.numel() * stored.element_size()
    optim = 0
    if save_optimizer and ds.optimizer is not None:
        optim = _tensor_bytes(getattr(ds.optimizer, "state", {}).values())
        optim += _tensor_bytes(optimizer_layouts.master_tensors(ds.optimizer))
    dp = engine.topology.dp
    partitioned_optim = optimizer_layouts.partitioned(ds.optimizer)  # ZeRO or bf16 wrapper
    totals = collectives.all_gather((params, optim))
    params_total = sum(t[0] for t in totals) // (1 if zero_stage == 3 else dp)
    optim_total = sum(t[1] for t in totals) // (1 if partitioned_optim else dp)
    if ds.optimizer is not None and optimizer_layouts.is_bf16_wrapper(ds.optimizer):
        optim_total += optim_total // dp  # model states repeat data-parallel rank 0's partition
    return int((params_total + optim_total) * _MARGIN)


def load_engine_state(engine, root: Path, tag: str, module_only: bool, load_optimizer: bool,
                      load_lr_schedule: bool) -> None:
    """DeepSpeed loads `root/tag` into the engine. Collective."""
    ds = engine.engine
    install(ds)
    if (optimizer_layouts.partitions_weights(ds) and not load_optimizer
            and read_latest(root) != tag):
        # DeepSpeed then rebuilds the weights from the checkpoint `latest` names, not from `tag`
        raise CheckpointError(
            f"cannot load {root / tag} without its optimizer state under ZeRO stage 3 while "
            f"{root / 'latest'} names {read_latest(root)!r}: DeepSpeed would read the weights of "
            "that one. Point `latest` at the checkpoint to load, or load the optimizer state")
    bf16_wrapper = optimizer_layouts.is_bf16_wrapper(ds.optimizer)
    configured = _settings(ds.optimizer)
    with torch.no_grad():  # (its pipeline load broadcasts tied weights in place)
        path, _ = ds.load_checkpoint(str(root), tag=tag, load_module_only=module_only,
                                     load_optimizer_states=load_optimizer and not bf16_wrapper,
                                     load_lr_scheduler_states=load_lr_schedule)
    if path is None:
        raise CheckpointError(f"DeepSpeed could not load checkpoint {root / tag}; see its log "
                              "above")
    if bf16_wrapper and not module_only:
        if load_optimizer:
            optimizer_layouts.load_bf16_partition(ds, root, tag)
        else:
            optimizer_layouts.refresh_masters(ds.optimizer)  # fp32 masters from the weights
    _keep_configured_settings(ds.optimizer, configured, root / tag)


# set per step by the LR schedule (loaded with it), or the parameters themselves
_NOT_SETTINGS = ("params", "lr", "initial_lr")


def _settings(optimizer) -> list[dict]:
    """Each parameter group's settings (eps, betas, weight decay, ...) but its learning rate."""
    if optimizer is None:
        return []
    return [{k: v for k, v in g.items() if k not in _NOT_SETTINGS} for g in optimizer.param_groups]


def _keep_configured_settings(optimizer, configured: list[dict], where: Path) -> None:
    """Put back the settings this run's config gave the optimizer, which DeepSpeed's load
    replaced with the checkpoint's, so that a run trains the same whether or not its layout
    is the checkpoint's. A difference is logged."""
    if optimizer is None:
        return
    changes = {f"{k}: checkpoint {g[k]!r}, config {v!r}"
               for g, values in zip(optimizer.param_groups, configured)
               for k, v in values.items() if k in g and g[k] != v}
    for group, values in zip(optimizer.param_groups, configured):
        group.update(values)
    if changes and collectives.rank() == 0:
        log.warning("checkpoint %s was trained with other optimizer settings (%s): this run's "
                    "config applies", where, "; ".join(sorted(changes)))
