"""A finished run's command run again: its checkpoint is at train_iters and its run summary says
the run ended there, so there is nothing to train, evaluate or write. Torch-free: deepy.py
decides it before any worker starts (`finished_run`), and the workers apply the same rule to
the checkpoint they load (training.loop).

    line = finished_run(args)   # "nothing to train: ..." or None
"""

from __future__ import annotations

import json
from pathlib import Path

SUMMARY_FILE = "run_summary.json"


def ended_at(log_dir: str | None, iteration: int) -> bool:
    """Whether `log_dir`'s run summary is of a run that ended at `iteration`: its last
    evaluations and the summary itself were done (they follow the last checkpoint)."""
    if not log_dir:
        return False
    try:
        figures = json.loads((Path(log_dir) / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(figures, dict) and figures.get("end_iteration") == iteration


def nothing_to_train(args, iteration: int) -> str:
    """The line of a run whose checkpoint has reached train_iters (a finished run's command run
    again): it ends at once, writing nothing, where GPT-NeoX would evaluate and save again."""
    t = args.training.train_iters
    where = "at" if iteration == t else "past"
    return (f"nothing to train: the checkpoint in {args.checkpoint.load} is at iteration "
            f"{iteration}, {where} train_iters ({t}); nothing was evaluated or written. Raise "
            "train_iters (with override_lr_scheduler or use_checkpoint_lr_scheduler) to train "
            "further")


def finished_run(args) -> str | None:
    """train.py's `nothing_to_train` line when the checkpoint the run would load first (a
    fine-tune run again: its own latest) is at train_iters or past it and the run summary in
    log_dir says the run ended there; else None (the workers start)."""
    from megatron.checkpointing.fine_tune import resume_fine_tune
    from megatron.checkpointing.locate import planned_manifest

    args = resume_fine_tune(args)
    ck = args.checkpoint
    if not ck.load or ck.finetune:
        return None
    manifest = planned_manifest(Path(ck.load), ck.iteration)
    if manifest is None or manifest.iteration < args.training.train_iters:
        return None
    if not ended_at(args.logging.log_dir, manifest.iteration):
        return None
    return nothing_to_train(args, manifest.iteration)
