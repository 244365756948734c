"""Which checkpoint a DPO/KTO run reads its reference model from (megatron/training/reference.py
builds the model); torch-free, so deepy.py checks a resumed run's reference before any worker
starts.

    source = reference_source(args, resumed)   # {"path", "iteration", "manifest_sha256"}

A run that starts records the checkpoint `load` names, with the sha256 of its manifest; a run
resumed from its own checkpoint reads the recorded one, at `reference_load` when it has moved
(the same iteration and manifest, or it is refused naming both).
"""

from __future__ import annotations

from pathlib import Path

from megatron.checkpointing.layout import manifest_digest
from megatron.monitoring.logger import get_logger

log = get_logger("megatron.training.reference")

# in a checkpoint's client state: {"path": step dir, "iteration": n, "manifest_sha256": hex}
SOURCE_KEY = "reference"


def gone_message(path) -> str:
    return (f"the reference model of this run, {path}, is gone (DPO and KTO compare the policy "
            "with the checkpoint training started from): restore it at that path, or set "
            "reference_load to where it is now")


def not_resuming_message(moved: str) -> str:
    return (f"reference_load({moved}) points to where a resumed run's reference checkpoint has "
            "moved, but this run records none: it starts, and its reference model is the "
            "checkpoint `load` names. Remove reference_load.")


def reference_source(args, resumed: dict, announce: bool = True) -> dict:
    """{"path", "iteration", "manifest_sha256"} of the checkpoint the reference model is read
    from: the one the run recorded (at `reference_load` if set), else the one loaded now.
    `announce`: log where a moved reference is read from (the workers do; deepy.py's check
    does not)."""
    from megatron.checkpointing.layout import iteration_of

    saved, moved = resumed.get(SOURCE_KEY), args.training.reference_load
    if saved:
        return _moved_source(dict(saved), moved, announce) if moved else dict(saved)
    from megatron.checkpointing.load import LOADED_FROM

    if moved:
        raise ValueError(not_resuming_message(moved))
    loaded = resumed.get(LOADED_FROM)
    impl = args.training.train_impl
    if not loaded:
        from megatron.neox_arguments.validate_post_training import no_reference_message

        raise ValueError(no_reference_message(impl))
    return {"path": loaded, "iteration": iteration_of(Path(loaded).name),
            "manifest_sha256": manifest_digest(Path(loaded))}


def _moved_source(saved: dict, moved: str, announce: bool) -> dict:
    """The recorded reference `saved`, read from `moved` (a step directory, or the directory
    holding global_step<iteration>) once it is the same checkpoint."""
    from megatron.checkpointing.layout import MANIFEST_NAME, iteration_of, tag_for

    where = Path(moved).absolute()
    own = (where / MANIFEST_NAME).is_file() or iteration_of(where.name) is not None
    step = where if own else where / tag_for(saved["iteration"])
    recorded = f"the reference checkpoint this run recorded, {saved['path']} (iteration " \
               f"{saved['iteration']})"
    if not step.is_dir():
        raise FileNotFoundError(f"reference_load({moved}): {step} is not a directory; it should "
                                f"hold {recorded}")
    digest, expected = manifest_digest(step), saved.get("manifest_sha256")
    if iteration_of(step.name) not in (None, saved["iteration"]):
        raise ValueError(f"reference_load({moved}): {step} is iteration "
                         f"{iteration_of(step.name)}, not {recorded}")
    if expected is not None and digest is None:
        raise ValueError(f"reference_load({moved}): {step} has no {MANIFEST_NAME}, so it cannot "
                         f"be compared with {recorded}")
    if expected is not None and digest != expected:
        raise ValueError(f"reference_load({moved}): {step} is another checkpoint than {recorded}:"
                         " its manifest differs (sha256 " + f"{digest} against {expected})")
    if expected is None:
        if iteration_of(step.name) != saved["iteration"]:
            raise ValueError(f"reference_load({moved}): this run's checkpoints recorded no "
                             f"manifest digest of its reference, so {step} must be named "
                             f"{tag_for(saved['iteration'])} to be taken for {recorded}")
        if announce:
            log.warning("reference_load: %s is iteration %s as recorded; this run's "
                        "checkpoints recorded no manifest digest to compare", step,
                        saved["iteration"])
    if announce:
        log.info("reference model moved: recorded %s, read from %s", saved["path"], step)
    return {**saved, "path": str(step), "manifest_sha256": digest}
