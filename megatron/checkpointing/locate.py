"""Which checkpoint to read, and whether it is intact: the one resolver and the one verifier
every reader uses (training, generation, eval, Hugging Face export, reshard, inspect).

    tags, notes = find_candidates(root, iteration)     # training: latest, then newest first
    step_dir = step_directory(path, iteration)         # a reader: path itself, N, or latest
    manifest = open_verified(step_dir)                 # sizes + sha256, or CorruptFileError

A directory GPT-NeoX wrote has no manifest: it is recognised by DeepSpeed's files and described
by neox_format, and verified for completeness (no checksums exist to compare).

Training resumes from `latest` and, when that is missing or damaged, from the newest checkpoint
that verifies (A24); a reader (generation, eval, export) reads exactly the checkpoint it is
pointed at, `iteration=N` or the one `latest` names, and refuses it when damaged. Both verify
through `verify_checkpoint`, so a damaged file is named the same way everywhere.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from megatron.checkpointing import collectives
from megatron.checkpointing.errors import CorruptFileError
from megatron.checkpointing.layout import (LATEST, MANIFEST_NAME, iteration_of, read_latest,
                                           saved_iterations, tag_for)
from megatron.checkpointing.manifest import Manifest, assign_files, check_files, read_manifest


def _saved(root: Path) -> str:
    return ", ".join(str(i) for i in saved_iterations(root)) or "none"


def missing_iteration(root: Path, iteration: int) -> FileNotFoundError:
    """The error for an `iteration` that has no checkpoint in `root`."""
    return FileNotFoundError(f"checkpoint {root / tag_for(iteration)} (iteration={iteration}) "
                             f"does not exist; saved iterations in {root}: {_saved(root)}")


def no_fine_tune_source(root: Path | None) -> FileNotFoundError:
    """The error for `finetune: true` with no `load`, or one that holds no checkpoint (GPT-NeoX
    would go on from random weights; a fine-tune from nothing is refused instead)."""
    if root is None:
        where = "load is not set"
    else:
        where = f"load {root} " + ("holds no checkpoint" if root.is_dir() else "does not exist")
    return FileNotFoundError(
        f"finetune is true but {where}: a fine-tune starts from the weights there. "
        "Point load at the directory holding the checkpoint's global_step<N> directories (a "
        "Hugging Face model: convert it with tools/ckpts/convert_hf_to_neox.py first), or "
        "remove finetune to train from random weights")


def find_candidates(root: Path, iteration: int | None, fallback: bool = True
                    ) -> tuple[list[str], list[str]]:
    """(tags to try in order, warnings about `latest`). With `iteration`, only that one
    (FileNotFoundError when it is missing); else the tag `latest` names, then (training,
    `fallback`) every other checkpoint, newest first. Without `fallback` (a reader), a missing
    or dangling `latest` is a FileNotFoundError."""
    saved = [tag_for(i) for i in reversed(saved_iterations(root))]
    if iteration is not None:
        if not (root / tag_for(iteration)).is_dir():
            raise missing_iteration(root, iteration)
        return [tag_for(iteration)], []
    latest = read_latest(root)
    if latest is None:
        if not fallback:
            state = "an empty" if (root / LATEST).is_file() else "no"
            found = (f"{', '.join(reversed(saved))}); pick one with iteration=<N> (--iteration "
                     "in the tools) or give its global_step<N> directory" if saved else
                     "none); give the directory a run saved to")
            raise FileNotFoundError(f"no checkpoint to load in {root}: it has {state} '{LATEST}' "
                                    f"file (checkpoints found: {found}")
        notes = [f"{root / LATEST} is missing but {root} holds {', '.join(saved)}: loading the "
                 "newest one that verifies"] if saved else []
        return saved, notes
    if not (root / latest).is_dir():
        if not fallback:
            raise FileNotFoundError(f"{root / LATEST} names {latest!r} but {root / latest} does "
                                    f"not exist (saved iterations: {_saved(root)})")
        return saved, [f"{root / LATEST} names {latest!r} but {root / latest} does not exist; "
                       "loading the newest checkpoint that verifies instead"]
    return [latest] + ([t for t in saved if t != latest] if fallback else []), []


def checkpoint_dir(load: str | None, iteration: int | None) -> Path:
    """The step directory a reader configured with `load` / `iteration` reads (generate.py and
    eval.py; deepy.py asks the same before their workers start)."""
    if not load:
        raise ValueError("generation and evaluation read a trained checkpoint, but 'load' is not "
                         "set; set load to the directory the training run saved to")
    return step_directory(Path(load), iteration, key="load")


def check_reshard_settings(ck) -> None:
    """tools/ckpts/reshard.py: `load` and `save` set and different, the whole state kept (`ck`:
    the checkpoint section of the config; deepy.py and the workers check them)."""
    if not ck.load or not ck.save:
        raise ValueError("resharding reads the checkpoint in 'load' and writes it to 'save': set "
                         "both (e.g. load=checkpoints/run save=checkpoints/run_tp2)")
    if Path(ck.load).resolve() == Path(ck.save).resolve():
        raise ValueError(f"'save' and 'load' are both {ck.load}: write the resharded checkpoint "
                         "to another directory, so that the original stays as it is")
    if ck.finetune or ck.no_load_optim:
        raise ValueError("resharding keeps the whole state; remove finetune / no_load_optim")


def reshard_source(ck) -> int:
    """The iteration tools/ckpts/reshard.py rewrites: `iteration`, else the one `latest` names,
    never an older one in its place (a damaged one is refused when it is verified); its
    global_step directory must not exist in `save` yet, as a checkpoint is never overwritten."""
    check_reshard_settings(ck)
    load = Path(ck.load)
    check_save_directory(load)
    step = step_directory(load, ck.iteration, key="load")
    iteration = iteration_of(step.name)
    target = Path(ck.save) / tag_for(iteration)
    if target.exists():
        raise FileExistsError(f"{target} already exists: resharding never overwrites a "
                              "checkpoint; choose another 'save' directory, or remove that one")
    return iteration


def step_directory(path: Path, iteration: int | None = None, key: str | None = None) -> Path:
    """A reader's checkpoint: `path` itself when it is one (a global_step<N> directory), else
    the save directory's `iteration`, else the one its `latest` names (find_candidates without
    fallback). `key`: the config key `path` came from, named in the errors."""
    path = Path(path)
    if not path.is_dir():
        where = f" (config key '{key}')" if key else ""
        if path.exists():
            raise FileNotFoundError(f"checkpoint directory {path}{where} is a file: give the "
                                    "directory a run saved to, or one global_step<N> in it")
        raise FileNotFoundError(f"checkpoint directory {path}{where} does not exist")
    if _one_checkpoint(path):
        own = iteration_of(path.name)
        if iteration is None or iteration == own:
            return path
        raise FileNotFoundError(
            f"{path} is one checkpoint" + (f" (iteration {own})" if own is not None else "")
            + f", but iteration={iteration} asks for another: give the directory that holds "
            f"them ({path.parent}) with iteration={iteration}, or this one without iteration")
    tags, _ = find_candidates(path, iteration, fallback=False)
    return path / tags[0]


def check_save_directory(load: Path) -> None:
    """Training and resharding read `load` as the directory a run saved to: refuse one
    checkpoint in its place (a global_step<N> directory, as a run's last line names it), which
    would otherwise read as a directory holding none."""
    if load.is_dir() and _one_checkpoint(load):
        own = iteration_of(load.name)
        raise ValueError(f"load={load} is one checkpoint; set load to the directory that holds "
                         f"it ({load.parent})" + (f" and iteration={own}" if own is not None
                                                  else ""))


def check_save_holds_no_other_run(ck) -> None:
    """train.py: refuse a `save` directory holding checkpoints this run does not go on from
    (`load` unset, or another directory): its checkpoints would replace them iteration for
    iteration and move `latest` back. A fine-tune's `save` is judged by
    fine_tune.resume_fine_tune."""
    if not ck.save or ck.finetune:
        return
    save = Path(ck.save)
    saved = saved_iterations(save)
    if not saved or (ck.load and Path(ck.load).resolve() == save.resolve()):
        return
    tags = [tag_for(i) for i in saved]
    listing = ", ".join(tags if len(tags) <= 3 else [tags[0], "...", *tags[-2:]])
    latest = read_latest(save)
    held = f"{listing}" + (f"; latest {latest}" if latest else "")
    source = "load is not set" if not ck.load else f"load is {ck.load}"
    raise ValueError(f"save {ck.save} already holds checkpoints ({held}) that this run does "
                     f"not go on from ({source}): its checkpoints would replace them and move "
                     f"latest. Set load={ck.save} to go on from them, or give save an empty "
                     "directory")


def _one_checkpoint(path: Path) -> bool:
    """Whether `path` is a checkpoint (a global_step<N> directory, or one with a manifest)
    rather than a save directory holding them."""
    return iteration_of(path.name) is not None or (path / MANIFEST_NAME).is_file()


def planned_manifest(root: Path, iteration: int | None) -> Manifest | None:
    """The manifest of the checkpoint training would try first (read, not verified), or None
    when there is none: what start-up needs to know before the model exists."""
    root = Path(root)
    try:
        tags, _ = find_candidates(root, iteration)
    except FileNotFoundError:
        return None
    for tag in tags:
        try:
            return read_any_manifest(root / tag)
        except CorruptFileError:
            continue
    return None


def newest_good_iteration(root: Path) -> int | None:
    """The newest checkpoint in `root` whose manifest reads and records a finite last loss
    (or none: written before losses were recorded, or from weights alone); None when there is
    none. Its files are verified when it is loaded."""
    for iteration in reversed(saved_iterations(Path(root))):
        try:
            loss = read_manifest(Path(root) / tag_for(iteration)).client_state.get("last_loss")
        except CorruptFileError:
            continue
        if loss is None or math.isfinite(loss):
            return iteration
    return None


def read_any_manifest(step_dir: Path) -> Manifest:
    """Our manifest.json, or for a directory GPT-NeoX wrote (DeepSpeed's files, no manifest)
    the description neox_format gives it; CorruptFileError when neither reads."""
    if (Path(step_dir) / MANIFEST_NAME).is_file():  # ours: neox_format (and torch) not needed
        return read_manifest(step_dir)
    from megatron.checkpointing import neox_format

    if neox_format.is_neox_directory(step_dir):
        return neox_format.describe(step_dir)
    return read_manifest(step_dir)


def verify_checkpoint(directory: Path) -> tuple[Manifest | None, list[str]]:
    """(manifest, problems found by any rank). Collective when torch.distributed is
    initialized: every rank checks the sizes of all files and hashes its share of them."""
    from megatron.checkpointing import neox_format

    rank, world = collectives.rank(), collectives.world_size()
    manifest = None
    try:
        manifest = read_any_manifest(directory)
        if neox_format.is_neox(manifest):  # no checksums: every file present and non-empty
            local = neox_format.verify(directory, manifest) if rank == 0 else []
        else:
            share = assign_files(manifest.files, world)[rank]
            local = check_files(directory, manifest, share, threads=min(4, os.cpu_count() or 1))
    except CorruptFileError as err:
        local = [str(err)]
    problems = sorted({p for found in collectives.all_gather(local) for p in found})
    return (None if problems else manifest), problems


def damaged(directory: Path, problems: list[str]) -> str:
    """The one message for a checkpoint that failed verification, every bad file named."""
    return (f"checkpoint {directory} is damaged and will not be loaded:\n  - "
            + "\n  - ".join(problems))


RESTORE = ("\nRestore the files from a backup or pick another checkpoint (iteration=<N>, or its "
           "global_step<N> directory)")


def open_verified(step_dir: Path) -> Manifest:
    """The manifest of `step_dir` once every file matches it; CorruptFileError naming each
    damaged file otherwise. Collective like verify_checkpoint."""
    manifest, problems = verify_checkpoint(step_dir)
    if problems:
        raise CorruptFileError(damaged(step_dir, problems) + RESTORE)
    return manifest
