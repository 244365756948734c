"""Which lm-eval tasks to run: registry names, local task YAMLs, directories of them.

Each entry of `eval_tasks` is one of
- a name from lm-eval's registry (`lambada_openai`, `hellaswag`; their datasets download from
  the Hugging Face Hub on first use),
- a name defined by a task YAML in one of the `eval_include_path` directories,
- a path to a task YAML (`*.yaml`): its directory joins the include path, its `task` (or
  `group`) name is run,
- a path to a directory: it joins the include path and every task its YAMLs define is run.
A local task reads local data with `dataset_path: json` and `dataset_kwargs: {data_files: ...}`
(paths relative to the working directory). The registry is scanned (~10 s) only when some name
is not found in the local directories; an unknown name is an error listing the nearest names.
deepy.py refuses an unknown name before any worker starts (check_task_names): a name that no
file of lm-eval's task directory or of the include path spells is looked up in the registry
there, so a misspelt name costs one scan and no launch.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import os
import re
from pathlib import Path

import yaml


class TaskYamlLoader(yaml.SafeLoader):
    """SafeLoader that reads lm-eval's `!function module.name` tags as plain strings."""


TaskYamlLoader.add_multi_constructor("!", lambda loader, suffix, node: str(node.value))


# the datasets library's builders of local files: without data_files they look for files of
# their kind under the working directory (eval.py sat silent at full CPU in a repository)
LOCAL_FILE_BUILDERS = ("json", "csv", "text", "parquet", "arrow")


def task_name_of(path: Path) -> str | None:
    """The task (or group) a task YAML defines, or None for a file that defines neither; a task
    that reads local files must say which."""
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=TaskYamlLoader)
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"cannot read task file {path}: {err}") from None
    if not isinstance(doc, dict):
        return None
    kwargs = doc.get("dataset_kwargs")
    if (doc.get("dataset_path") in LOCAL_FILE_BUILDERS and "include" not in doc
            and not (isinstance(kwargs, dict) and kwargs.get("data_files"))):
        raise ValueError(
            f"task file {path}: dataset_path {doc['dataset_path']} reads local files but names "
            "none; add dataset_kwargs: {data_files: {test: path/to/data.jsonl}} (paths relative "
            "to the working directory); without them the datasets library looks for data "
            "files under the working directory")
    if isinstance(doc.get("group"), str):
        return doc["group"]
    return doc["task"] if isinstance(doc.get("task"), str) else None


def check_eval_settings(ev) -> None:
    """eval.py's keys (`args.eval`) that need no lm-eval to judge (deepy.py and every worker)."""
    if not ev.eval_tasks:
        raise ValueError("eval.py needs eval_tasks, e.g. eval_tasks='[lambada_openai, hellaswag]' "
                         "or a path to a task .yaml file")
    if ev.eval_batch_size < 1:
        raise ValueError(f"eval_batch_size({ev.eval_batch_size}) must be at least 1")
    if ev.eval_limit is not None and ev.eval_limit <= 0:
        raise ValueError(f"eval_limit({ev.eval_limit}) must be positive (or null for all)")
    if ev.eval_limit is not None and ev.eval_limit > 1 and ev.eval_limit != int(ev.eval_limit):
        # lm-eval reads a limit of 1 or more as int(limit) documents
        raise ValueError(f"eval_limit({ev.eval_limit}) is a count of documents per task from "
                         f"1 up, so it must be whole (e.g. {int(ev.eval_limit)}), or a fraction "
                         "of them below 1")


def reads_only_local_files(entries: list[str]) -> bool:
    """Whether every task in `entries` is a task YAML given by path (a file, or a directory of
    them) that reads local files (dataset_path json, csv, ...): then lm-eval needs nothing from
    the Hugging Face Hub. A task named (registry, eval_include_path) may need it."""
    files, all_paths = _task_yaml_files(entries)
    if not all_paths:
        return False
    for path in files:
        try:
            doc = yaml.load(path.read_text(encoding="utf-8"), Loader=TaskYamlLoader)
        except (OSError, yaml.YAMLError):
            return False
        if not isinstance(doc, dict) or "include" in doc or \
                doc.get("dataset_path") not in LOCAL_FILE_BUILDERS:
            return False
        kwargs = doc.get("dataset_kwargs")
        data_files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
        if "://" in json.dumps(data_files, default=str):  # https://, hf://: not local files
            return False
    return bool(files)


def _task_yaml_files(entries: list[str]) -> tuple[list[Path], bool]:
    """(the task YAML files `entries` give by path, a directory standing for every YAML in it;
    whether every entry is such a path)."""
    files: list[Path] = []
    all_paths = True
    for entry in entries:
        path = Path(entry)
        if entry.endswith((".yaml", ".yml")) and path.is_file():
            files.append(path)
        elif path.is_dir():
            files += sorted(path.glob("**/*.yaml"))
        else:
            all_paths = False
    return files, all_paths


def check_local_data_files(entries: list[str]) -> None:
    """deepy.py: the local files (dataset_kwargs.data_files, relative to the working directory,
    as the datasets library reads them) of every task YAML eval_tasks gives by path exist, so
    that a missing one is named with its task before any worker loads the model."""
    for path in _task_yaml_files(entries)[0]:
        try:
            doc = yaml.load(path.read_text(encoding="utf-8"), Loader=TaskYamlLoader)
        except (OSError, yaml.YAMLError):
            continue  # lm-eval names a file it cannot read
        if not isinstance(doc, dict) or doc.get("dataset_path") not in LOCAL_FILE_BUILDERS:
            continue
        kwargs = doc.get("dataset_kwargs")
        data_files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
        listed = (data_files.items() if isinstance(data_files, dict)
                  else [(None, data_files)] if data_files else [])
        for split, names in listed:
            for name in [names] if isinstance(names, str) else names or []:
                if isinstance(name, str) and "://" not in name and "*" not in name \
                        and not Path(name).exists():
                    key = "data_files" + (f".{split}" if split is not None else "")
                    raise FileNotFoundError(
                        f"task {doc.get('task', path.stem)} ({path}): dataset_kwargs.{key} "
                        f"{name} does not exist (a relative path is read from the working "
                        f"directory, {os.getcwd()})")


def resolve_task_entries(entries: list[str], include_paths: list[str] | None
                         ) -> tuple[list[str], list[str]]:
    """(task names to run, directories to add to lm-eval's include path)."""
    names: list[str] = []
    include = [str(Path(p)) for p in include_paths or ()]
    for p in include:
        if not Path(p).is_dir():
            raise FileNotFoundError(f"eval_include_path entry {p} is not a directory")
    for entry in entries:
        path = Path(entry)
        if entry.endswith((".yaml", ".yml")):
            if not path.is_file():
                raise FileNotFoundError(f"task file {entry} (in eval_tasks) does not exist")
            if path.suffix != ".yaml":
                raise ValueError(f"task file {entry}: lm-eval only reads task files named "
                                 "*.yaml; rename it")
            name = task_name_of(path)
            if name is None:
                raise ValueError(f"task file {entry} defines no 'task' or 'group' name")
            names.append(name)
            include.append(str(path.parent))
        elif path.is_dir():
            found = [n for f in sorted(path.glob("**/*.yaml")) if (n := task_name_of(f))]
            if not found:
                raise ValueError(f"directory {entry} (in eval_tasks) holds no task YAML files")
            names += found
            include.append(str(path))
        else:
            names.append(entry)
    return list(dict.fromkeys(names)), list(dict.fromkeys(include))


def unknown_tasks_message(unknown: list[str], known: list[str]) -> str:
    """One line naming each unknown task with the nearest known names."""
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.7)
        parts.append(f"'{name}'" + (f" (did you mean: {', '.join(close)}?)" if close else ""))
    return (f"unknown lm-eval task {', '.join(parts)}; a task is a name from lm-eval's registry, "
            "a path to a task .yaml file, a directory of them, or a name defined in "
            "eval_include_path")


# lm-eval's warning that it applies eval_num_fewshot 0 to a task without a default of its own:
# what it does with no num_fewshot at all
_SAME_FEWSHOT = re.compile(r"^Overwriting default num_fewshot of .+ from None to 0$")


# lm-eval's modules that draw progress bars without a switch (building requests; bootstrapping)
_HARNESS_BAR_MODULES = ("lm_eval.api.task", "lm_eval.api.metrics")


def quiet_harness() -> None:
    """lm-eval's output in the project's form: its warnings as `[rank N] [time] [WARNING]
    [lm_eval] ...` lines on stderr, which the launcher prints once for all the ranks that print
    them alike, its info lines hidden (LMEVAL_LOG_LEVEL shows them), and the progress bars of
    lm-eval and of the datasets library drawn only where the project's are (rank 0, on a
    terminal or with NEOX_PROGRESS=1: megatron.monitoring.progress)."""
    import logging
    import os

    from megatron.monitoring.logger import adopt_logger
    from megatron.monitoring.progress import progress_enabled

    handler = adopt_logger("lm_eval", "lm_eval")
    if not any(getattr(f, "_megatron", False) for f in handler.filters):
        def drop(record: logging.LogRecord) -> bool:
            return not _SAME_FEWSHOT.match(record.getMessage())

        drop._megatron = True  # type: ignore[attr-defined]
        handler.addFilter(drop)
    level = os.environ.get("LMEVAL_LOG_LEVEL", "").upper()
    logging.getLogger("lm_eval").setLevel(level if isinstance(logging.getLevelName(level), int)
                                          else logging.WARNING)
    if not progress_enabled():
        import functools

        import datasets
        from tqdm import tqdm

        datasets.disable_progress_bars()
        # lm-eval draws its bars with the tqdm these modules imported (tqdm reads TQDM_DISABLE
        # only when it is first imported, long before this)
        for module in _HARNESS_BAR_MODULES:
            module = importlib.import_module(module)
            if getattr(module, "tqdm", None) is tqdm:
                module.tqdm = functools.partial(tqdm, disable=True)


def _task_texts(directories: list[Path]) -> bytes:
    """Every file under `directories` but Python sources and READMEs, joined: the task YAMLs and
    the templates they include (`_default_template_yaml` and other names without .yaml), where
    each task, group and tag name is spelt."""
    parts = []
    for directory in directories:
        for parent, subdirs, files in os.walk(directory):
            subdirs[:] = [d for d in subdirs if d not in ("__pycache__", ".ipynb_checkpoints")]
            for name in files:
                if not name.endswith((".py", ".pyc", ".md")):
                    with open(os.path.join(parent, name), "rb") as f:
                        parts.append(f.read())
    return b"\n".join(parts)


def check_task_names(names: list[str], include: list[str]) -> None:
    """deepy.py: refuse, before any worker starts, a task name that neither lm-eval's registry
    nor the include path defines. Reading the task files' text takes a fraction of a second
    (building lm-eval's registry takes 10 s or more): a name spelt in some file is left to the
    workers' registry, and only a name spelt in none is looked up in lm-eval's registry here,
    so the refusal and its suggestions are lm-eval's own."""
    import importlib.util

    spec = importlib.util.find_spec("lm_eval")
    registry = [Path(p) / "tasks" for p in (spec.submodule_search_locations or ())] \
        if spec else []
    texts = _task_texts([*registry, *map(Path, include)])
    if all(n.encode() in texts for n in names):
        return
    task_manager_for(names, include, quiet=False)


def task_manager_for(names: list[str], include: list[str], quiet: bool = True):
    """An lm-eval TaskManager that knows every name: local directories only when they suffice
    (fast, offline), else together with lm-eval's registry. lm-eval's output is made the
    project's first (quiet_harness) unless `quiet` is false (deepy.py's check)."""
    from lm_eval.tasks import TaskManager

    if quiet:
        quiet_harness()
    if include and "include_defaults" in inspect.signature(TaskManager).parameters:
        local = TaskManager(include_path=include, include_defaults=False)
        if all(n in local.all_tasks for n in names):
            return local
    manager = TaskManager(include_path=include or None)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        raise ValueError(unknown_tasks_message(unknown, manager.all_tasks))
    return manager
