"""Resuming: find the checkpoint to load, load it through DeepSpeed, return our client state."""

from __future__ import annotations

from pathlib import Path

from megatron.checkpointing.layout import read_latest, tag_for
from megatron.monitoring.logger import get_logger

log = get_logger(__name__)


def load_checkpoint(engine, args) -> dict:
    """Load `load` (its `latest`, or the chosen `iteration`) into the engine; {} when starting fresh.

    `finetune` loads weights only and restarts the iteration count; `no_load_optim` keeps the
    fresh optimizer and LR schedule.
    """
    ck = args.checkpoint
    if not ck.load:
        return {}
    load_dir = Path(ck.load)
    tag = tag_for(ck.iteration) if ck.iteration is not None else read_latest(load_dir)
    if tag is None:
        log.info("no checkpoint in %s (no 'latest' file): starting from iteration 0", load_dir)
        return {}
    if not (load_dir / tag).is_dir():
        raise FileNotFoundError(
            f"checkpoint {load_dir / tag} does not exist (named by "
            f"{'iteration=' + str(ck.iteration) if ck.iteration is not None else load_dir / 'latest'}); "
            f"pick an existing global_step directory or remove the setting")
    module_only = bool(ck.finetune)
    path, client_state = engine.engine.load_checkpoint(
        str(load_dir), tag=tag,
        load_module_only=module_only,
        load_optimizer_states=not (module_only or ck.no_load_optim),
        load_lr_scheduler_states=not (module_only or ck.no_load_optim))
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {load_dir / tag}; see the log above")
    log.info("loaded checkpoint %s", load_dir / tag)
    if module_only:
        return {}
    return client_state or {}
