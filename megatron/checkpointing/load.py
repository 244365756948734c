"""Resuming: pick the newest checkpoint that verifies, check it fits this run, load it (A22-A24).

    1. rank 0 removes what interrupted saves left in the save directory
    2. candidates: the tag `latest` names, then every other global_step<N>, newest first; with
       `iteration` set, only that one
    3. per candidate, every rank checks every file's size and hashes its share of the files
       (split by size over the ranks); the ranks exchange what they found, so they all accept or
       all reject it. A rejected checkpoint is reported loudly, file by file, and the next one
       is tried; when none verifies, NoValidCheckpointError lists what is wrong with each
    4. the metadata is compared with this run (A23): another model shape is refused with an
       explanation; another parallel layout is resharded (reshard.py)
    5. at the same layout DeepSpeed loads weights / optimizer / LR schedule and each rank
       restores its RNG states; at another layout, or from a checkpoint written without an
       engine (tools/ckpts/convert_hf_to_neox.py), every rank reads its part of the full state
"""

from __future__ import annotations

from pathlib import Path

from megatron.checkpointing import (collectives, data_position, engine_state, neox_format,
                                    reshard, rng)
from megatron.checkpointing.compatibility import check_compatible, describe_run, layout_changes
from megatron.checkpointing.errors import NoValidCheckpointError
from megatron.checkpointing.layout import rng_file
from megatron.checkpointing.locate import (check_save_directory, damaged, find_candidates,
                                           no_fine_tune_source, verify_checkpoint)
from megatron.checkpointing.model_shape import head_change, position_table_warning
from megatron.checkpointing.manifest import Manifest
from megatron.checkpointing.retention import remove_leftovers
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)

LOADED_FROM = "loaded_from"  # key of the returned dict: the step directory that was loaded


# what to do when no checkpoint of `load` verifies, as training can choose
NO_VALID_ADVICE = ("Restore the files from a backup, pick another with iteration=<N>, or remove "
                   "`load` to start from scratch")


def load_checkpoint(engine, ck, advice: str = NO_VALID_ADVICE, resharding: bool = False) -> dict:
    """Load `ck.load` (its newest valid checkpoint, or the chosen `ck.iteration`) into the
    engine; `ck` is the checkpoint section of the config, `engine.run` describes the run.

    Returns the saved client state (iteration, consumed samples, ...) and, under LOADED_FROM,
    the step directory loaded; {} when there is nothing to load, only LOADED_FROM with
    `finetune` (weights only, iteration count restarts). `no_load_optim` keeps
    the fresh optimizer and LR schedule, `no_load_rng` the seeded generators. `advice` ends
    the error when no checkpoint verifies. Collective.
    """
    if not ck.load:
        if ck.finetune:  # deepy.py refused it before the workers started
            raise no_fine_tune_source(None)
        return {}
    root = Path(ck.load)
    check_save_directory(root)  # deepy.py checked it too
    if collectives.rank() == 0 and ck.save and Path(ck.save).is_dir():
        remove_leftovers(Path(ck.save))
    candidates = _agreed_candidates(root, ck.iteration)
    if not candidates:
        if ck.finetune:  # deepy.py refused it before the workers started
            raise no_fine_tune_source(root)
        if not root.exists() and ck.save and Path(ck.save).resolve() != root.resolve():
            # not the first run of load = save: a path given to go on from, mistyped or moved
            log.warning("load %s does not exist (save is %s): starting from iteration 0; fix "
                        "load if this run should go on from a checkpoint", root, ck.save)
        else:
            log.info("no checkpoint in %s: starting from iteration 0", root)
        return {}
    rejected: list[tuple[str, list[str]]] = []
    for tag in candidates:
        manifest, problems = verify_checkpoint(root / tag)
        if problems:  # said once: with the one loaded instead, or in the error below
            rejected.append((tag, problems))
            if ck.iteration is not None:
                break
            continue
        current = describe_run(engine)
        if neox_format.is_neox(manifest):
            manifest = neox_format.fill_from_run(manifest, current)
            _loud(f"{root / tag} was written by GPT-NeoX (no manifest): its files are checked "
                  "for completeness only, as it records no checksums")
        check_compatible(manifest.run, current, manifest.format_version, root / tag)
        note = (None if neox_format.is_neox(manifest)  # GPT-NeoX's own table: the same layout
                else position_table_warning(manifest.config.get("pos_emb"), manifest.run,
                                            root / tag))
        if note:
            _loud(note)
        changes = layout_changes(manifest.run, current)
        if head_change(manifest.run, current, bool(ck.finetune), root / tag):
            changes.append("LM head: left out, the value head starts fresh")
        if rejected:
            for skipped, problems in rejected:
                _loud(damaged(root / skipped, problems))
            _loud(f"loading {root / tag} instead, the newest checkpoint that verifies "
                  f"(skipped: {', '.join(t for t, _ in rejected)})")
        return _load(engine, ck, root, tag, manifest, changes, resharding)
    raise NoValidCheckpointError(
        f"no checkpoint in {root} can be loaded:\n"
        + "\n".join(f"  {tag}:\n    - " + "\n    - ".join(p) for tag, p in rejected)
        + "\n" + advice)


def _agreed_candidates(root: Path, iteration: int | None) -> list[str]:
    """find_candidates as rank 0 sees the directory, on every rank (its notes logged)."""
    found = None
    if collectives.rank() == 0:
        try:
            found = (find_candidates(root, iteration), None)
        except FileNotFoundError as err:
            found = (([], []), str(err))
    (candidates, notes), missing = collectives.broadcast(found)
    if missing:
        raise FileNotFoundError(missing)
    for note in notes:
        _loud(note)
    return candidates


def _load(engine, ck, root: Path, tag: str, manifest: Manifest, changes: list[str],
          resharding: bool) -> dict:
    has_optimizer = bool(manifest.contents.get("optimizer", True))
    keep_fresh = bool(ck.finetune or ck.no_load_optim)
    if not has_optimizer and not keep_fresh and collectives.rank() == 0:
        why = manifest.contents.get("optimizer_note") or (
            "saved with no_save_optim" if manifest.contents.get("engine", True)
            else "written from weights alone")
        log.warning("checkpoint %s: no optimizer state is loaded (%s): the optimizer starts "
                    "fresh, its moments restart", root / tag, why)
    expert_parallel = max(int(manifest.run.get("ep") or 1), engine.topology.ep) > 1
    if changes or expert_parallel or not manifest.contents.get("engine", True):
        # (expert parallelism, even at the same layout: checkpointing/expert_files.py)
        _load_resharded(engine, ck, root / tag, manifest, changes,
                        load_optimizer=has_optimizer and not keep_fresh, resharding=resharding)
        if not (changes or ck.finetune or ck.no_load_rng):
            _restore_rng(engine, root / tag, manifest)
    else:
        engine_state.load_engine_state(engine, root, tag, module_only=bool(ck.finetune),
                                       load_optimizer=has_optimizer and not keep_fresh,
                                       load_lr_schedule=not keep_fresh)
        if not (ck.finetune or ck.no_load_rng):
            _restore_rng(engine, root / tag, manifest)
    log.info("loaded checkpoint %s (iteration %d)", root / tag, manifest.iteration)
    loaded = {LOADED_FROM: str((root / tag).absolute())}
    if ck.finetune:
        return loaded
    return {**data_position.resumed_state(manifest.client_state), **loaded}


def _load_resharded(engine, ck, directory: Path, manifest: Manifest, changes: list[str],
                    load_optimizer: bool, resharding: bool = False) -> None:
    """Every rank reads the full state and takes its part (reshard.py)."""
    wanted = reshard.local_names(engine)
    # the optimizer files are read whenever they exist: their fp32 master copies are the exact
    # weights (a bf16 run's module weights are rounded)
    saved_optimizer = bool(manifest.contents.get("optimizer", True))
    full = reshard.read_full_state(directory, manifest, saved_optimizer, wanted,
                                   required=load_optimizer)
    for name in wanted - set(full.weights):  # a fresh value head keeps its initial weights
        if name.endswith(".value.weight"):
            full.weights[name] = reshard.initial_value(engine, name)
    reshard.place_full_state(engine, full, engine.run.sharding, engine.run.optimizer_state,
                             load_optimizer=load_optimizer,
                             load_lr_schedule=not (ck.finetune or ck.no_load_optim),
                             load_counters=not ck.finetune)
    if not changes and manifest.contents.get("engine", True):
        log.info("loaded %s through its layout-free state (expert parallelism)", directory)
        return
    what = ("weights, optimizer state" if full.has_optimizer and load_optimizer
            else "weights") + " loaded; random generators keep their seeded state"
    said = (f"resharded {directory} into this run's layout ({'; '.join(changes)}): {what}"
            if changes else f"loaded {directory}, written without a training engine: {what}")
    if ck.finetune or resharding:  # asked for: what it loaded, not a caveat
        if collectives.rank() == 0:
            log.info("%s", said)
    else:
        _loud(said)


def _restore_rng(engine, directory: Path, manifest: Manifest) -> None:
    rank = collectives.rank()
    if not manifest.contents.get("rng", False):
        if rank == 0:
            log.warning("checkpoint %s has no RNG states (saved with no_save_rng): generators "
                        "keep their seeded state", directory)
        return
    name = rng_file(rank)
    if name not in manifest.files:
        saved_world = manifest.run.get("world_size")
        log.warning("checkpoint %s has RNG states for %s ranks, none for rank %d: it keeps its "
                    "seeded generators", directory, saved_world, rank)
        return
    tp_rng = getattr(getattr(engine, "tp", None), "rng", None)
    skipped = rng.restore(rng.load(directory, name, manifest.files[name].record), tp_rng)
    for what in skipped:
        log.warning("RNG restore from %s skipped %s", directory / name, what)


def _loud(message: str) -> None:
    """A warning every user sees: rank 0 logs it (other ranks hold the same message)."""
    if collectives.rank() == 0:
        log.warning("%s", message)
