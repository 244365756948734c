"""What `deepy.py` decides from the config and the files before any worker starts.

    preflight(args, "train.py")   # ValueError naming the key / file and what to do

For a training run (train.py): every data prefix has its `.bin`/`.idx` pair with a readable
header (named with its config key), the tokenizer's files load, and fp16 is asked for only
where a local launch has CUDA.

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
    """Raise ValueError / FileNotFoundError for what would make `script`'s workers fail at
    start-up."""
    name = Path(script).name
    if name == "train.py":
        _check_training_inputs(args)
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


DATA_KEYS = ("data_path", "train_data_paths", "valid_data_paths", "test_data_paths")


def _check_training_inputs(args) -> None:
    from megatron.data.indexed_dataset import MMapIndexedDataset
    from megatron.tokenizer import build_tokenizer

    for key in DATA_KEYS:
        value = getattr(args.data, key)
        for prefix in ([value] if isinstance(value, str) else value or []):
            try:
                MMapIndexedDataset(prefix)
            except (FileNotFoundError, ValueError) as err:
                raise type(err)(f"{key}: {err}") from None
    tok = args.tokenizer
    build_tokenizer(tok.tokenizer_type, tok.vocab_file, tok.merge_file)
    if args.derived.precision == "fp16" and not args.launcher.hostfile:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("fp16 training needs a CUDA GPU: DeepSpeed's CPU accelerator has no "
                             "fp16 support. On CPU use bf16 ('bf16: {enabled: true}', fast on CPUs "
                             "with AMX) or fp32 (remove the fp16 section)")


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
