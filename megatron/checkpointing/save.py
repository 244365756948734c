"""Saving a checkpoint atomically across ranks (A20, A21, A22).

    1. rank 0 removes what interrupted saves left and checks the free space against the
       estimated size (A21); too little aborts the save on every rank
    2. every rank: DeepSpeed writes its files into <save>/.staging-global_step<N>/, and the rank
       writes rng/rank_<r>.pt; each file is hashed while written and fsynced
    3. the ranks exchange what they wrote and whether it failed (this is the barrier); any
       failure aborts the save on every rank and the staging directory is removed
    4. rank 0 commits: config.yml and manifest.json, fsync of the directories, rename of the
       staging directory to global_step<N>, then `latest` replaced atomically, then retention
    5. rank 0 tells every rank how the commit went; a failed commit raises on every rank
A crash or error at any point leaves `latest` naming the previous complete checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import traceback
from pathlib import Path

from megatron.checkpointing import (collectives, data_position, engine_state, faults, rng,
                                    shard_index)
from megatron.checkpointing.compatibility import describe_run
from megatron.checkpointing.durable import (fsync_dir, free_bytes, rename, replace_text,
                                            sha256_file, write_bytes)
from megatron.checkpointing.errors import CheckpointSaveError, CorruptFileError
from megatron.checkpointing.layout import (CONFIG_NAME, LATEST, MANIFEST_NAME, REPLACED_PREFIX,
                                           read_latest, rng_file, staging_tag, tag_for)
from megatron.checkpointing.manifest import FileEntry, Manifest, read_manifest, write_manifest
from megatron.checkpointing.retention import apply_retention, remove_leftovers
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)


def save_checkpoint(engine, ck, iteration: int, client_state: dict) -> Path:
    """Write `<save>/global_step<iteration>/` on every rank and point `<save>/latest` at it;
    `ck` is the checkpoint section of the config, `engine.run` describes the run (run.py).

    Collective. Raises CheckpointSaveError on every rank when the save is aborted; the previous
    checkpoint then stays the one `latest` names.
    """
    root, tag, run = Path(ck.save), tag_for(iteration), engine.run
    rank = collectives.rank()
    if ck.no_save_optim and run.zero_stage == 3:
        raise ValueError("no_save_optim cannot be used with ZeRO stage 3: the weights themselves "
                         "live in the optimizer partitions; remove no_save_optim or use stage <= 2")
    state = data_position.client_state(iteration, client_state)
    described = describe_run(engine)
    needed = engine_state.estimate_bytes(engine, not ck.no_save_optim, run.zero_stage)
    _raise_on_every_rank(_prepare(root, tag, needed) if rank == 0 else None)

    written, error = _write_rank_files(engine, ck, root, staging_tag(tag), state, iteration, rank)
    faults.kill_if_planned(rank, iteration)  # TEST-ONLY hook (faults.py)
    reports = collectives.all_gather((written, error, state))  # the barrier before the commit
    _check_reports(root, tag, reports, rank)

    outcome = None
    if rank == 0:
        files = {name: FileEntry(rec.size, rec.sha256, r)
                 for r, (recs, _, _) in enumerate(reports) for name, rec in recs.items()}
        manifest = Manifest(iteration=iteration, tag=tag, run=described,
                            contents={"optimizer": not ck.no_save_optim, "rng": not ck.no_save_rng},
                            client_state=state, config=run.config, files=files,
                            versions=_versions())
        outcome = _commit(root, tag, staging_tag(tag), manifest, run.config_yaml,
                          ck.keep_last_n_checkpoints, engine_state.in_use(engine, root))
    _raise_on_every_rank(outcome)
    log.info("saved checkpoint %s", root / tag)
    return root / tag


def _raise_on_every_rank(problem: str | None) -> None:
    """Rank 0's verdict, raised as CheckpointSaveError on all ranks when it is a problem."""
    problem = collectives.broadcast(problem)
    if problem:
        raise CheckpointSaveError(problem)


def _check_reports(root: Path, tag: str, reports: list, rank: int) -> None:
    """Abort on every rank when any rank failed to write or the client states disagree (A18).
    Every rank holds the same reports, so every rank reaches the same verdict."""
    errors = [f"rank {r}: {e}" for r, (_, e, _) in enumerate(reports) if e]
    disagree = data_position.disagreement([s for _, _, s in reports])
    if not (errors or disagree):
        return
    if rank == 0:
        shutil.rmtree(root / staging_tag(tag), ignore_errors=True)
    reasons = "; ".join(errors + ([disagree] if disagree else []))
    raise CheckpointSaveError(
        f"checkpoint {root / tag} was not saved: {reasons}. Nothing was committed: "
        f"{root / LATEST} still names {read_latest(root) or 'no checkpoint'}")


def _prepare(root: Path, tag: str, estimate: int) -> str | None:
    """Rank 0: create `root`, remove leftovers, check free space. A problem message or None."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        remove_leftovers(root)
        free = free_bytes(root)
    except OSError as err:
        return f"checkpoint {root / tag} was not saved: cannot prepare {root} ({err})"
    needed = max(estimate, _previous_size(root))
    if free < needed:
        return (f"checkpoint {root / tag} was not saved: {root} has {free:,} bytes free but the "
                f"checkpoint needs about {needed:,} bytes ({needed / 2**30:.2f} GiB). The previous "
                f"checkpoint ({read_latest(root) or 'none'}) is kept; free space, lower "
                "keep_last_n_checkpoints, or point `save` at another disk")
    return None


def _previous_size(root: Path) -> int:
    """Bytes of the checkpoint `latest` names (a good estimate of the next one), or 0."""
    tag = read_latest(root)
    if tag is None:
        return 0
    try:
        return read_manifest(root / tag).total_bytes
    except CorruptFileError:
        return 0


def _write_rank_files(engine, ck, root: Path, staging: str, state: dict, iteration: int,
                      rank: int):
    """This rank's DeepSpeed files, RNG file and shard index, in staging: (records, first error
    or None)."""

    def before_write(path: Path) -> None:
        faults.enospc_if_planned(rank, iteration, path)  # TEST-ONLY hook (faults.py)

    records, error = engine_state.save_engine_state(engine, root, staging, state,
                                                    save_optimizer=not ck.no_save_optim,
                                                    before_write=before_write)
    if error is None and not ck.no_save_rng:
        target = root / staging
        try:
            before_write(target / rng_file(rank))
            records[rng_file(rank)] = rng.save(target, rng_file(rank), _tp_rng(engine))
        except OSError as err:
            error = f"writing {target / rng_file(rank)}: {err}"
    if error is None:
        target = root / staging
        index = shard_index.describe(engine, root, staging, not ck.no_save_optim)
        try:
            before_write(target / shard_index.index_file(rank))
            records[shard_index.index_file(rank)] = shard_index.save(target, index)
        except OSError as err:
            error = f"writing {target / shard_index.index_file(rank)}: {err}"
    return records, error


def _tp_rng(engine):
    return getattr(getattr(engine, "tp", None), "rng", None)


def _versions() -> dict:
    import deepspeed
    import torch

    return {"torch": torch.__version__, "deepspeed": deepspeed.__version__}


def _commit(root: Path, tag: str, staging: str, manifest: Manifest, config_yaml: str,
            keep_last: int | None, in_use: tuple[str, ...]) -> str | None:
    """Rank 0: make the staged checkpoint durable and current. A problem message or None."""
    stage_dir, target = root / staging, root / tag
    previous = read_latest(root)
    replaced = root / (REPLACED_PREFIX + tag)
    try:
        record = write_bytes(config_yaml.encode("utf-8"), stage_dir / CONFIG_NAME)
        files = {**manifest.files, CONFIG_NAME: FileEntry(record.size, record.sha256, 0)}
        files.update(_unrecorded_files(stage_dir, files))
        manifest = dataclasses.replace(manifest, files=files)
        write_manifest(stage_dir, manifest)
        for directory in sorted({p.parent for p in stage_dir.rglob("*")}, reverse=True):
            fsync_dir(directory)
        if target.exists():  # a re-save of the same iteration
            rename(target, replaced)
        rename(stage_dir, target)
        fsync_dir(root)
        replace_text(root / LATEST, tag)
        shutil.rmtree(replaced, ignore_errors=True)
    except Exception as err:  # noqa: BLE001 - any failure must reach the other ranks
        log.error("commit of %s failed:\n%s", target, traceback.format_exc())
        shutil.rmtree(stage_dir, ignore_errors=True)
        if replaced.exists() and not target.exists():
            os.replace(replaced, target)  # put the checkpoint being re-saved back
        return (f"checkpoint {target} was not committed ({err}); {root / LATEST} still names "
                f"{previous or 'no checkpoint'}")
    try:
        apply_retention(root, keep_last, tag, in_use)
    except OSError as err:
        log.warning("could not remove old checkpoints in %s (%s); the new one is saved", root, err)
    return None


def _unrecorded_files(stage_dir: Path, known: dict) -> dict[str, FileEntry]:
    """Files DeepSpeed wrote without our engine (e.g. ZeRO's zero_to_fp32.py): fsynced and
    hashed here so that the manifest lists everything in the directory."""
    found = {}
    for path in sorted(p for p in stage_dir.rglob("*") if p.is_file()):
        name = path.relative_to(stage_dir).as_posix()
        if name in known or name == MANIFEST_NAME:
            continue
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        size, digest = sha256_file(path)
        found[name] = FileEntry(size, digest, 0)
    return found
