"""A fine-tune's own checkpoints: a `finetune: true` run records the checkpoint it started from,
so that its command, run again after a stop, resumes from its own latest checkpoint instead of
starting over from `load` (and overwriting what it saved). Torch-free: deepy.py decides it
before any worker starts, and the workers apply the same rule.

    args = resume_fine_tune(args)             # a resumed fine-tune: load = save, finetune off
    record = fine_tune_record(resumed, ck)    # what its checkpoints carry, FINE_TUNED_FROM

GPT-NeoX reads `load` again on every start of a fine-tune, so a stopped fine-tune run again
restarts at iteration 0.
"""

from __future__ import annotations

from pathlib import Path

from megatron.checkpointing.layout import iteration_of, manifest_digest
from megatron.checkpointing.locate import find_candidates, planned_manifest
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)

# in a checkpoint's client state: {"path": step dir, "iteration": n, "manifest_sha256": hex}
FINE_TUNED_FROM = "fine_tuned_from"


def fine_tune_record(resumed: dict, finetune: bool) -> dict | None:
    """The checkpoint this run's fine-tune started from: the one loaded now when it starts
    (`resumed` is load_checkpoint's answer), the recorded one when it resumed; None for a run
    that is not a fine-tune."""
    from megatron.checkpointing.load import LOADED_FROM

    if not finetune:
        return resumed.get(FINE_TUNED_FROM)
    loaded = resumed.get(LOADED_FROM)
    if not loaded:
        return None
    return {"path": loaded, "iteration": iteration_of(Path(loaded).name),
            "manifest_sha256": manifest_digest(Path(loaded))}


def resume_fine_tune(args, announce: bool = False):
    """`args`, or for a fine-tune whose `save` already holds its own checkpoints, `args` that
    resume from them (load = save, finetune off). ValueError when `save` is `load` (the
    fine-tune's checkpoints would mix with the ones it starts from, its step numbers starting
    again at 0) or holds checkpoints of something else, which the fine-tune would overwrite."""
    ck = args.checkpoint
    if not (ck.finetune and ck.save and ck.load):
        return args
    save = Path(ck.save)
    if save.resolve() == Path(ck.load).resolve():
        raise ValueError(
            f"finetune is true and save is load ({ck.save}): the fine-tune's checkpoints, "
            "numbered from iteration 0 again, would mix with the ones it starts from (and could "
            "replace them). Give save another directory")
    manifest = planned_manifest(save, None)
    if manifest is None:  # nothing saved yet: the fine-tune starts
        return args
    recorded = manifest.client_state.get(FINE_TUNED_FROM)
    latest = f"{save / manifest.tag} (iteration {manifest.iteration})"
    source = _source(Path(ck.load), ck.iteration)
    if recorded and source is not None and _same(recorded, source):
        if announce:
            log.info("fine-tune resumes from its own checkpoint %s; it started from %s",
                     latest, recorded["path"])
        return resumed_from_save(args)
    if recorded:
        now = f"load names {source}" if source is not None else f"{ck.load} holds no checkpoint"
        what = (f"a fine-tune of {recorded['path']} (iteration {recorded['iteration']}), and "
                f"{now}")
    else:
        what = ("which records no fine-tune source (not a fine-tune, or one saved before "
                "fine-tunes recorded it)")
    raise ValueError(
        f"save {ck.save} already holds {latest}, {what}: this fine-tune would overwrite it. "
        f"Give an empty save directory, or go on from {save / manifest.tag} with load={ck.save} "
        "and finetune false")


def resumed_from_save(args):
    """`args` of a fine-tune resumed from its own latest checkpoint in `save`."""
    return args.replace(load=args.checkpoint.save, finetune=False, iteration=None)


def _source(load: Path, iteration: int | None) -> Path | None:
    """The step directory a fine-tune would read from `load`, or None when it holds none."""
    try:
        tags, _ = find_candidates(load, iteration)
    except FileNotFoundError:
        return None
    return (load / tags[0]).resolve() if tags else None


def _same(recorded: dict, step: Path) -> bool:
    """Whether `step` is the checkpoint `recorded` names: the same manifest, or (a checkpoint
    without one) the same path."""
    digest = manifest_digest(step)
    if recorded.get("manifest_sha256") and digest:
        return recorded["manifest_sha256"] == digest
    return Path(recorded["path"]).resolve() == step
