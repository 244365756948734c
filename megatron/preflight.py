"""What `deepy.py` decides from the config and the files before any worker starts.

    preflight(args, "train.py")   # ValueError naming the key / file and what to do

For a run that loads a checkpoint (train.py, tools/ckpts/reshard.py):
- the padded vocabulary: the checkpoint's own size must split over this run's
  model_parallel_size and hold the tokenizer's ids (checkpointing.model_shape.vocab_for_run;
  the workers build the model with that size);
- the learning-rate schedule (train.py, a checkpoint a training engine wrote): a schedule
  that differs from the checkpoint's needs
  override_lr_scheduler or use_checkpoint_lr_scheduler, as in GPT-NeoX
  (training.learning_rates.check_resumable; the workers apply the same rule on load).
Each check reads only the manifest and config.yml of the checkpoint the run would load first.
"""

from __future__ import annotations

from pathlib import Path

LOADING_SCRIPTS = ("train.py", "reshard.py")


def preflight(args, script: str) -> None:
    """Raise ValueError for what would make `script`'s workers fail at start-up."""
    name = Path(script).name
    ck = args.checkpoint
    if name not in LOADING_SCRIPTS or not ck.load or ck.finetune:
        return
    from megatron.checkpointing.locate import planned_manifest

    manifest = planned_manifest(Path(ck.load), ck.iteration)
    if manifest is None:
        return
    step_dir = Path(ck.load) / manifest.tag
    _check_vocab(args, step_dir)
    # a checkpoint written from weights alone (e.g. converted from Hugging Face) has no schedule
    if name == "train.py" and not ck.no_load_optim and manifest.contents.get("engine", True):
        _check_schedule(args, step_dir)


def _check_vocab(args, step_dir: Path) -> None:
    from megatron.checkpointing.model_shape import vocab_for_run
    from megatron.neox_arguments import padded_vocab_size
    from megatron.tokenizer import build_tokenizer

    tok = args.tokenizer
    tokenizer = build_tokenizer(tok.tokenizer_type, tok.vocab_file, tok.merge_file)
    tp = args.parallelism.model_parallel_size
    default = padded_vocab_size(tokenizer.vocab_size, args.model.make_vocab_size_divisible_by, tp)
    vocab_for_run(str(step_dir.parent), args.checkpoint.iteration, default, tp,
                  tokenizer.vocab_size)


def _check_schedule(args, step_dir: Path) -> None:
    from megatron.checkpointing.layout import CONFIG_NAME
    from megatron.neox_arguments import NeoXArgs
    from megatron.training.learning_rates import check_resumable, lr_schedule

    config = step_dir / CONFIG_NAME
    if not config.is_file():
        return  # no config recorded (a weights-only or foreign checkpoint): the workers decide
    saved = NeoXArgs.from_yml_saved(config)
    ls = args.lr_schedule
    check_resumable(lr_schedule(saved), lr_schedule(args), ls.use_checkpoint_lr_scheduler,
                    ls.override_lr_scheduler)
