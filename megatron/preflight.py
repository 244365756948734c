"""What `deepy.py` decides from the config and the files before any worker starts.

    preflight(args, "train.py")   # ValueError naming the key / file and what to do

For train.py, generate.py and eval.py, the memory one worker needs is estimated and logged,
and a run that cannot fit in what this machine has is refused (training.memory_check, A30).

For train.py and eval.py, the package of every tracker the config asks for (TensorBoard, wandb,
Comet) is installed (monitoring.trackers.check_trackers_installed).

For each, the directories its workers write into (save, log_dir, tensorboard_dir,
data_cache_dir, memory_profiling_path, the samples' and the eval results' directories) are
directories this process can write in, or can be created (paths.check_writable; the workers
would fail on them, at the first checkpoint for `save`).

For train.py, generate.py, eval.py and tools/ckpts/reshard.py, the tokenizer's files load. For
train.py, `save` holds no checkpoints the run does not go on from (load unset or another
directory: they would be replaced; checkpointing.locate.check_save_holds_no_other_run). For
train.py and reshard.py, no live run holds the save directory (megatron.safety.lock); for
reshard.py, `load` and `save` are set and differ and `load` holds a checkpoint. For
generate.py, the input file holds prompts (input-file mode) and the prompts plus maximum_tokens
fit the model's positions (A14); for eval.py, its settings are
valid, lm-eval is installed (A28) and the task files and directories in eval_tasks exist and
define tasks (registry names are looked up by the workers), and where the workers will read
datasets offline, the local cache holds every task's Hub dataset (for train.py's eval_tasks
too; task_data.check_offline_data). For train.py, every data
prefix has its `.bin`/`.idx` pair with a readable header (named with its config key) and only
token ids the tokenizer has (A12; the largest id is kept in data_cache_dir, where the workers
find it: megatron.data.token_ids), label,
reward and rejected-response files belong with their token files (megatron.data.aligned), DPO
and KTO have a model to start from and compare with, a reward model starts from a language model
only as a fine-tune, and fp16 is asked for only where a local launch has CUDA
(host.check_precision_supported).

For a run that loads a checkpoint:
- the model shape the manifest records (layers, widths, heads, experts) is this config's
  (checkpointing.model_shape.shape_mismatches, A23; the workers check it again), for
  generate.py and eval.py too, which also refuse a reward model's checkpoint, a `load` that
  is unset or names no checkpoint (checkpointing.locate.checkpoint_dir) and a checkpoint with
  a file missing or of another size than its manifest records (A24), before the memory
  estimate is logged;
- the padded vocabulary: the checkpoint's own size must split over this run's
  model_parallel_size and hold the tokenizer's ids (checkpointing.model_shape.resumed_vocab;
  the workers build the model with that size);
- the learning-rate schedule (train.py, a checkpoint a training engine wrote): a schedule that
  differs from the checkpoint's needs override_lr_scheduler or use_checkpoint_lr_scheduler, as
  in GPT-NeoX (training.learning_rates.check_resumable; the workers apply the same rule);
- the data (train.py): each token file at a path the checkpoint's fingerprints name has the
  content it had (A17; the workers also compare moved, added and dropped files).
Each check reads only the manifest and config.yml of the checkpoint the run would load first.
"""

from __future__ import annotations

import os
from pathlib import Path

from megatron.host import check_precision_supported, cuda_available
from megatron.model.compile import check_supported as check_compile_supported
from megatron.paths import check_writable

LOADING_SCRIPTS = ("train.py", "reshard.py")
TRACKING_SCRIPTS = ("train.py", "eval.py")
MEMORY_SCRIPTS = ("train.py", "generate.py", "eval.py")


def preflight(args, script: str, workers_here: int = 1) -> None:
    """Raise ValueError / FileNotFoundError / RuntimeError for what would make `script`'s
    workers fail at start-up; `workers_here` of them start on this machine."""
    name = Path(script).name
    if name in TRACKING_SCRIPTS:
        from megatron.monitoring.trackers import check_trackers_installed

        check_trackers_installed(args)
    if name not in LOADING_SCRIPTS and name not in MEMORY_SCRIPTS:
        return
    if name == "train.py":
        from megatron.checkpointing.fine_tune import resume_fine_tune

        args = resume_fine_tune(args)  # a fine-tune run again resumes from its own checkpoint
        from megatron.checkpointing.locate import check_save_holds_no_other_run

        check_save_holds_no_other_run(args.checkpoint)
        opened = _check_training_inputs(args)
        _check_tasks_in_training(args)
    for key, directory in _output_directories(args, name):
        check_writable(key, directory)
    samples = args.text_generation.sample_output_file
    if name == "generate.py" and samples and Path(samples).is_dir():
        raise ValueError(f"sample_output_file {samples} is a directory: give the path of the "
                         "JSON-lines file to write, e.g. "
                         f"{Path(samples) / 'samples.jsonl'}")
    if name not in LOADING_SCRIPTS:  # generate.py, eval.py
        tokenizer = _tokenizer(args)
        _check_inference_inputs(args, name, tokenizer)
        _check_inference_checkpoint(args, name)
        _check_memory(args, name, tokenizer, workers_here)
        if name == "eval.py":
            _check_task_data(args)
        return
    if name == "reshard.py":
        from megatron.checkpointing.locate import reshard_source

        args = args.replace(iteration=reshard_source(args.checkpoint))
    tokenizer = _tokenizer(args)
    if name in MEMORY_SCRIPTS:
        _check_memory(args, name, tokenizer, workers_here)
    from megatron.safety.lock import check_free

    check_free(args.checkpoint.save)  # another live run writes there
    if name == "train.py":
        _check_token_ids(args, opened, tokenizer)
    ck = args.checkpoint
    if not ck.load:
        if ck.finetune and name == "train.py":
            from megatron.checkpointing.locate import no_fine_tune_source

            raise no_fine_tune_source(None)
        return
    from megatron.checkpointing.locate import check_save_directory, planned_manifest

    check_save_directory(Path(ck.load))  # one global_step<N> would read as holding none
    if ck.finetune:
        from megatron.checkpointing.locate import find_candidates, no_fine_tune_source

        if name == "train.py" and not find_candidates(Path(ck.load), ck.iteration)[0]:
            raise no_fine_tune_source(Path(ck.load))
        return

    manifest = planned_manifest(Path(ck.load), ck.iteration)
    if manifest is None:
        if name == "reshard.py":
            from megatron.checkpointing.locate import find_candidates

            if not find_candidates(Path(ck.load), ck.iteration)[0]:
                raise FileNotFoundError(f"no checkpoint to reshard in {ck.load}")
        return
    step_dir = Path(ck.load) / manifest.tag
    _check_shape(args, manifest.run, step_dir)
    _check_vocab(args, tokenizer, manifest.run.get("padded_vocab_size"), step_dir)
    # a checkpoint written from weights alone (e.g. converted from Hugging Face) has no schedule
    if name == "train.py" and not ck.no_load_optim and manifest.contents.get("engine", True):
        _check_schedule(args, step_dir)
    if name == "train.py":
        _note_sequence_change(args, step_dir)
        _check_same_data(args, opened, manifest.client_state)


def _missing_or_resized(step_dir: Path, manifest) -> list[str]:
    """A24 before the workers, from sizes alone: the files the manifest lists are there with
    their sizes (a GPT-NeoX checkpoint's: there and not empty). The workers hash every file."""
    from megatron.checkpointing.layout import MANIFEST_NAME
    from megatron.checkpointing.manifest import check_files

    if (step_dir / MANIFEST_NAME).is_file():  # ours: neox_format (and torch) not needed
        return check_files(step_dir, manifest)
    from megatron.checkpointing import neox_format

    return neox_format.verify(step_dir, manifest)


def _check_shape(args, saved: dict, step_dir: Path) -> None:
    """A23 before the workers: the checkpoint holds this config's model shape (layers, widths,
    heads, experts); the vocabulary is checked apart (_check_vocab)."""
    from megatron.checkpointing.model_shape import describe_shape, shape_mismatches

    found = shape_mismatches(saved, describe_shape(args, None))
    if found:
        raise ValueError(f"checkpoint {step_dir} holds another model than this config ("
                         + "; ".join(found) + "): load it with the model config it was trained "
                         "with")


def _check_inference_inputs(args, script: str, tokenizer) -> None:
    """generate.py: the input file holds prompts (input-file mode), and each prompt (an
    unconditional sample's EOD) plus maximum_tokens fits max_position_embeddings (A14).
    eval.py: its settings, an installed lm-eval (A28), the task files and directories
    eval_tasks names, and its registry names (a name no task file spells is refused)."""
    if script == "generate.py":
        from megatron.text_generation.prompts import check_lengths, prompt_tokens, read_prompts

        tg, mode = args.text_generation, args.derived.text_gen_type
        if mode == "interactive":
            return  # each prompt is checked as it is read
        texts = (read_prompts(tg.sample_input_file, tg.prompt_end, warn=False)
                 if mode == "input-file" else [""])
        check_lengths([len(prompt_tokens(tokenizer, t)) for t in texts], tg.maximum_tokens,
                      args.model.max_position_embeddings)
        return
    from megatron.evaluation.lm_eval_version import require_lm_eval
    from megatron.evaluation.tasks import (check_eval_settings, check_task_names,
                                           resolve_task_entries)

    check_eval_settings(args.eval)
    require_lm_eval()
    check_task_names(*resolve_task_entries(args.eval.eval_tasks, args.eval.eval_include_path))
    if not args.launcher.hostfile:  # with a hostfile the workers read their own nodes' files
        from megatron.evaluation.tasks import check_local_data_files

        check_local_data_files(args.eval.eval_tasks)


def _check_inference_checkpoint(args, script: str) -> None:
    """generate.py and eval.py: `load` (and `iteration`) name a checkpoint that exists, and it is
    a language model (not a reward model's value head) of this config's shape. The workers
    verify every file and compare every architecture key again when they load it."""
    from megatron.checkpointing.errors import CorruptFileError
    from megatron.checkpointing.locate import RESTORE, checkpoint_dir, damaged, read_any_manifest
    from megatron.checkpointing.model_shape import reward_model_refusal

    ck = args.checkpoint
    step_dir = checkpoint_dir(ck.load, ck.iteration)
    try:
        manifest = read_any_manifest(step_dir)
    except CorruptFileError as err:
        raise CorruptFileError(damaged(step_dir, [str(err)]) + RESTORE) from None
    problems = _missing_or_resized(step_dir, manifest)
    if problems:
        raise CorruptFileError(damaged(step_dir, problems) + RESTORE)
    if manifest.run.get("value_head"):
        raise ValueError(reward_model_refusal(
            step_dir, "generation" if script == "generate.py" else "evaluation"))
    _check_shape(args, manifest.run, step_dir)
    _check_tokenizer_type(args, step_dir)


def _check_tokenizer_type(args, step_dir: Path) -> None:
    """The checkpoint's own config.yml, where it has one, names this run's tokenizer type: ids
    of another tokenizer are other text to the model, which then writes nonsense."""
    from megatron.checkpointing.layout import CONFIG_NAME
    from megatron.neox_arguments.load import read_yml

    saved = step_dir / CONFIG_NAME
    if not saved.is_file():
        return
    try:
        trained = read_yml(saved).get("tokenizer_type")
    except (OSError, ValueError):
        return  # the workers' load names a damaged file
    tok = args.tokenizer
    if trained and str(trained).lower() != str(tok.tokenizer_type).lower():
        raise ValueError(
            f"checkpoint {step_dir} was trained with tokenizer_type {trained} (its config.yml), "
            f"but this run's is {tok.tokenizer_type}: the model reads ids of its own tokenizer "
            f"as other text. Use its tokenizer (tokenizer_type {trained}, vocab_file as in "
            f"{saved})")


def _tokenizer(args):
    from megatron.tokenizer import build_tokenizer

    tok = args.tokenizer
    return build_tokenizer(tok.tokenizer_type, tok.vocab_file, tok.merge_file)


def _check_memory(args, script: str, tokenizer, workers_here: int) -> None:
    """A30: the estimate at the config's layout, against what a worker has here."""
    from megatron.training.memory_check import check_memory, padded_vocab

    check_memory(args, script, padded_vocab(args, tokenizer.vocab_size), workers_here)


DATA_KEYS = ("data_path", "train_data_paths", "valid_data_paths", "test_data_paths",
             *(f"{side}_{split}_data_paths" for side in ("pos", "neg")
               for split in ("train", "valid", "test")))


def _check_tasks_in_training(args) -> None:
    """eval_tasks during training: a layout that allows it, lm-eval installed (A28), task names
    it knows."""
    if not args.eval.eval_tasks:
        return
    from megatron.evaluation.during_training import refusal
    from megatron.evaluation.lm_eval_version import require_lm_eval

    why = refusal(args)
    if why:
        raise ValueError(why)
    require_lm_eval()
    from megatron.evaluation.tasks import check_task_names, resolve_task_entries

    check_task_names(*resolve_task_entries(args.eval.eval_tasks, args.eval.eval_include_path))
    _check_task_data(args)


def _check_task_data(args) -> None:
    """Offline, each lm-eval task's Hub dataset is in this machine's datasets cache, which the
    workers read (those of a hostfile launch read their own nodes' and check them themselves,
    before the model loads)."""
    if args.launcher.hostfile:
        return
    from megatron.evaluation.task_data import check_offline_data

    check_offline_data(args.eval, os.environ)


def _output_directories(args, script: str) -> list[tuple[str, str]]:
    """(config key, directory) of what `script`'s workers write."""
    lg, found = args.logging, []
    if script in LOADING_SCRIPTS and args.checkpoint.save:
        found.append(("save", args.checkpoint.save))
    if script in MEMORY_SCRIPTS:
        found += [("log_dir", lg.log_dir)] if lg.log_dir else []
    if script in TRACKING_SCRIPTS:
        found += [("tensorboard_dir", lg.tensorboard_dir)] if lg.tensorboard_dir else []
    if script == "train.py":
        found += [("data_cache_dir", args.data.data_cache_dir)] if args.data.data_cache_dir else []
        if lg.memory_profiling and lg.memory_profiling_path:
            found.append(("memory_profiling_path", lg.memory_profiling_path))
    if script == "generate.py":
        key = "sample_output_file" if args.text_generation.sample_output_file else "log_dir"
        found.append((key, str(Path(args.derived.sample_output_path).parent)))
    if script == "eval.py" and args.eval.eval_results_prefix:
        found.append(("eval_results_prefix", str(Path(args.eval.eval_results_prefix).parent)))
    if script == "eval.py" and args.eval.eval_cache_dir:
        found.append(("eval_cache_dir", args.eval.eval_cache_dir))
    return found


def _check_training_inputs(args) -> dict:
    """{prefix: MMapIndexedDataset} of every token file the config names, each opened (A16),
    after the checks that need no tokenizer."""
    from megatron.data.indexed_dataset import MMapIndexedDataset

    opened = {}
    for key in DATA_KEYS:
        value = getattr(args.data, key)
        for prefix in ([value] if isinstance(value, str) else value or []):
            try:
                opened.setdefault(prefix, MMapIndexedDataset(prefix))
            except (FileNotFoundError, ValueError) as err:
                raise type(err)(f"{key}: {err}") from None
    _check_split_sizes(args)
    if not args.launcher.hostfile:  # with a hostfile, the GPUs are on other machines
        check_precision_supported(args.derived.precision)
        check_compile_supported(args.model.torch_compile, args.derived.precision,
                                cuda_available())
    _check_side_files(args)
    _check_post_training_start(args)
    return opened


def _check_token_ids(args, opened: dict, tokenizer) -> None:
    """A12 before the workers: every token file's ids fit the tokenizer's vocabulary, as the
    workers check it; the largest id each holds is kept in data_cache_dir, where they read it."""
    from megatron.data.token_ids import check_token_ids

    for dataset in opened.values():
        check_token_ids(dataset, tokenizer.vocab_size, args.data.data_cache_dir)


def _check_same_data(args, opened: dict, client_state: dict) -> None:
    """A17 before the workers: the token files the checkpoint to resume was trained on have the
    content they had then, for each one this config names at the same path (the workers also
    pair moved files and name added or dropped ones)."""
    if args.checkpoint.allow_data_change:
        return  # the workers warn, naming the differences
    from megatron.data.fingerprints import changed_data_error, compare_fingerprints

    recorded = client_state.get("data_fingerprints")
    if not isinstance(recorded, dict):
        return  # none recorded (a GPT-NeoX checkpoint): nothing to compare
    saved = {p: f for p, f in recorded.items() if p in opened}
    differences = compare_fingerprints(saved, {p: opened[p].opened_fingerprint for p in saved})
    if differences:
        raise changed_data_error(args.checkpoint.load, differences)


def _check_split_sizes(args) -> None:
    """Data was given, and each split asked for samples gives at least one global batch (A9;
    the workers check it again as they build the datasets)."""
    from megatron.data.options import sample_counts, sample_options, token_paths
    from megatron.data.split_parts import check_split_sizes

    d, counts = args.data, sample_counts(args)
    train, valid, test = token_paths(args)
    check_split_sizes(
        data_path=d.data_path, train_data_paths=train, valid_data_paths=valid,
        test_data_paths=test, train_data_weights=d.train_data_weights,
        valid_data_weights=d.valid_data_weights, test_data_weights=d.test_data_weights,
        weight_by_num_documents=d.weight_by_num_documents, split=d.split,
        seq_length=args.model.seq_length,
        train_valid_test_num_samples=(counts.train, counts.valid, counts.test),
        global_batch_size=args.derived.train_batch_size, options=sample_options(args))


def _check_side_files(args) -> None:
    """The label, reward and rejected-response files belong with their token files (the checks
    the workers make again when they build the datasets), each error naming both files."""
    d = args.data
    if d.dataset_impl != "pairwise" and not any(
            getattr(d, f"{split}_{kind}_data_paths")
            for split in ("train", "valid", "test") for kind in ("label", "reward")):
        return  # no side files (and no import of torch before the workers start)
    from megatron.data.aligned import check_pair, open_labels, read_rewards
    from megatron.data.indexed_dataset import MMapIndexedDataset
    from megatron.data.options import sample_options, token_paths

    options = sample_options(args)
    for s, paths in enumerate(token_paths(args)):
        for i, prefix in enumerate(paths or []):
            tokens = MMapIndexedDataset(prefix)
            side = {kind: triple[s][i] for kind, triple in options.side_files.items()
                    if triple[s] is not None}
            if "neg" in side:
                neg = MMapIndexedDataset(side["neg"])
                check_pair(tokens, neg)
                if "neg_label" in side:
                    open_labels(side["neg_label"], neg)
            if "label" in side:
                open_labels(side["label"], tokens)
            if "reward" in side:
                read_rewards(side["reward"], tokens)


def _check_post_training_start(args) -> None:
    """DPO and KTO compare with the model training starts from: `load` must name one; a reward
    model starts from a language model only as a fine-tune."""
    from megatron.checkpointing.locate import find_candidates, planned_manifest
    from megatron.neox_arguments.validate_post_training import (needs_reference,
                                                                no_reference_message)

    t, ck = args.training, args.checkpoint
    if needs_reference(t):
        try:  # a load holding no checkpoint would be refused by the workers, once built
            nothing = not ck.load or not find_candidates(Path(ck.load), ck.iteration)[0]
        except FileNotFoundError:
            nothing = False  # the iteration asked for is missing: the load says so
        if nothing:
            raise ValueError(no_reference_message(
                t.train_impl, f"{ck.load} holds no checkpoint" if ck.load else "load is not set"))
    if not ck.load:
        return
    from megatron.checkpointing.model_shape import head_change

    manifest = planned_manifest(Path(ck.load), ck.iteration)
    if manifest is not None:
        head_change(manifest.run, {"value_head": t.train_impl == "rm"}, bool(ck.finetune),
                    Path(ck.load) / manifest.tag)
    if not needs_reference(t):
        return
    from megatron.training.reference_source import SOURCE_KEY, not_resuming_message

    recorded = manifest is not None and not ck.finetune and manifest.client_state.get(SOURCE_KEY)
    if recorded:
        _check_recorded_reference(args, manifest.client_state)
    elif t.reference_load:  # a run that starts: its reference is the checkpoint it loads
        raise ValueError(not_resuming_message(t.reference_load))


def _check_recorded_reference(args, client_state: dict) -> None:
    """A resumed DPO/KTO run's recorded reference checkpoint is where the workers will read it:
    at its recorded path, or at reference_load once it is the same checkpoint."""
    from megatron.training.reference_source import gone_message, reference_source

    path = Path(reference_source(args, client_state, announce=False)["path"])
    if not path.is_dir():
        raise FileNotFoundError(gone_message(path))


def _check_vocab(args, tokenizer, saved: int | None, step_dir: Path) -> None:
    from megatron.checkpointing.model_shape import resumed_vocab
    from megatron.neox_arguments import padded_vocab_size

    tp = args.parallelism.model_parallel_size
    default = padded_vocab_size(tokenizer.vocab_size, args.model.make_vocab_size_divisible_by, tp)
    resumed_vocab(default, saved, tp, tokenizer.vocab_size, step_dir)


def _note_sequence_change(args, step_dir: Path) -> None:
    """A resumed run at another seq_length goes on (GPT-NeoX's behaviour: context extension is
    done so), but its samples are cut anew: say that the data order does not continue."""
    from megatron.checkpointing.layout import CONFIG_NAME
    from megatron.monitoring.logger import get_logger
    from megatron.neox_arguments import NeoXArgs

    config = step_dir / CONFIG_NAME
    if not config.is_file():
        return
    saved, now = NeoXArgs.from_yml_saved(config).model.seq_length, args.model.seq_length
    if saved != now:
        get_logger(__name__).warning(
            "seq_length changes from %d (checkpoint %s) to %d: training goes on from the "
            "checkpoint's iteration and sample count, but the samples are cut anew at %d "
            "tokens, so the data does not continue where the checkpoint's samples stopped",
            saved, step_dir, now, now)


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
