"""Whether the local datasets cache holds the Hub datasets of lm-eval tasks, for offline runs.

Offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set, or deepy.py finding no connection to the Hub:
hub.py), lm-eval reads a registry task's dataset from the datasets cache only, and a missing one
used to fail in the workers after the model had loaded. `check_offline_data` decides it first:
deepy.py calls it before any worker starts (preflight, for a launch on this machine; the workers
of a hostfile launch read their own nodes' caches), and each worker again before the model loads.

A task's dataset is read from lm-eval's task files as lm-eval reads them (`include` templates
merged, groups and tags expanded to their tasks), but only the files that spell a wanted name
are parsed (a fraction of a second; building lm-eval's registry takes 10 s). The cache is asked
the question lm-eval will ask: `datasets.load_dataset_builder(dataset_path, dataset_name,
**dataset_kwargs)` in offline mode, which finds a cached copy or fails. Datasets on local files
(dataset_path json, csv, ..., or a local directory), custom loaders and Python tasks are not
checked, nor is any task when the workers may download.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from megatron.evaluation.hub import offline_reason, user_offline
from megatron.evaluation.tasks import (LOCAL_FILE_BUILDERS, TaskYamlLoader,
                                       reads_only_local_files, resolve_task_entries)

# the task config keys that say where a task's data comes from
DATA_KEYS = ("dataset_path", "dataset_name", "dataset_kwargs", "custom_dataset", "class")
# load_dataset's own arguments, which it does not pass on to load_dataset_builder
NOT_BUILDER_KWARGS = ("split", "verification_mode", "keep_in_memory", "save_infos", "streaming",
                      "num_proc")
MAX_ROUNDS = 8  # groups of groups of tags: each level may name tasks in other files
SHOWN = 4  # tasks / datasets named in the error before "and N more"
MAX_YAML_BYTES = 1 << 20  # lm-eval's largest task file is about 60 KB
NOT_YAML_SUFFIXES = (".py", ".pyc", ".md", ".json", ".jsonl", ".csv", ".tsv", ".txt", ".parquet",
                     ".arrow", ".gz", ".zst", ".zip", ".tar", ".sh")


@dataclass(frozen=True)
class HubData:
    """A task's dataset on the Hub: what lm-eval passes to datasets.load_dataset."""

    task: str
    path: str
    name: str | None
    kwargs: str  # dataset_kwargs as sorted JSON (hashable)

    def label(self) -> str:
        return self.path + (f" (config {self.name})" if self.name else "")


def check_offline_data(ev, environ, probe: bool = True) -> None:
    """FileNotFoundError naming each task whose Hub dataset the local cache lacks, when the
    workers read only that cache (see offline_reason; `probe`: deepy.py may try the Hub's
    connection, a worker goes by its environment alone)."""
    if reads_only_local_files(list(ev.eval_tasks)):
        return
    reason = offline_reason(environ) if probe else user_offline(environ)
    if not reason:
        return
    names, include = resolve_task_entries(ev.eval_tasks, ev.eval_include_path)
    missing = uncached(hub_datasets(names, include))
    if missing:
        raise FileNotFoundError(uncached_message(missing, reason))


def uncached_message(missing: dict[HubData, str], reason: str) -> str:
    """One line: the tasks, their datasets, the cache, why offline, and what to do."""
    import datasets

    tasks = list(dict.fromkeys(d.task for d in missing))
    data = list(dict.fromkeys(d.label() for d in missing))
    first = next(iter(missing))
    why = next((f"; {w}" for w in missing.values() if w), "")
    load = f"'{first.path}'" + (f", '{first.name}'" if first.name else "")
    verb = "tasks {} read" if len(tasks) > 1 else "task {} reads"
    return (f"lm-eval {verb.format(_listed(tasks))} {_listed(data)} from the Hugging Face Hub: "
            f"not in the local datasets cache ({datasets.config.HF_DATASETS_CACHE}{why}), and "
            f"the workers run offline ({reason}). Download where the Hub can be reached, with "
            "the same HF_HOME (e.g. python -c \"import datasets; datasets.load_dataset("
            f"{load})\", or this eval run there once), then copy that cache here or point "
            "HF_DATASETS_CACHE at it; or evaluate a local task YAML that reads local files "
            "(dataset_path: json)")


def _listed(items: list[str]) -> str:
    more = len(items) - SHOWN
    return ", ".join(items[:SHOWN]) + (f" and {more} more" if more > 0 else "")


# -- which datasets: the task files that spell the names ---------------------------------------

def hub_datasets(names: list[str], include: list[str]) -> list[HubData]:
    """The Hub datasets the tasks (groups, tags) `names` read. A name found in no task file is
    left out (lm-eval's registry, in the workers, refuses an unknown one)."""
    roots = [*_registry_roots(), *(Path(p) for p in include)]
    texts = {root: _yaml_texts(root) for root in roots}
    index: dict[str, tuple] = {}
    found, unknown = _walk(names, index)
    searched: set[str] = set()
    for _ in range(MAX_ROUNDS):  # a group's members may be defined in other files
        if not unknown - searched:
            break
        for name, entry in _index(texts, unknown - searched).items():
            index.setdefault(name, entry)
        searched |= unknown
        found, unknown = _walk(names, index)
    return [d for task, cfg in found if (d := _hub_data(task, cfg)) is not None]


def _registry_roots() -> list[Path]:
    spec = importlib.util.find_spec("lm_eval")
    return [Path(p) / "tasks" for p in (spec.submodule_search_locations or ())] if spec else []


def _yaml_texts(root: Path) -> dict[str, bytes]:
    """Every file under `root` that may be YAML, with its text: the task files (*.yaml, which
    lm-eval indexes) and the templates they include (`_default_template_yaml`, `_template`,
    `afrimmlu_direct`: any name), where a tag may be set for every task of a directory. Python
    sources, READMEs and data files (by their suffix, or over MAX_YAML_BYTES: a task's jsonl
    beside its YAML) are not read."""
    found = {}
    for parent, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in ("__pycache__", ".ipynb_checkpoints")]
        for name in files:
            path = os.path.join(parent, name)
            if (not name.lower().endswith(NOT_YAML_SUFFIXES)
                    and os.path.getsize(path) <= MAX_YAML_BYTES):
                with open(path, "rb") as f:
                    found[path] = f.read()
    return found


def _index(texts: dict[Path, dict[str, bytes]], names: set[str]) -> dict[str, tuple]:
    """{name: ("task", config) | ("group", config) | ("tag", [task]) | ("python", None)} from
    the task files of each directory where some file spells one of `names`; a later root
    (eval_include_path) overrides an earlier one, within one the first file in path order wins,
    as in lm-eval's registry."""
    words = [n.encode() for n in names]
    spelt = re.compile(rb"(?<![\w-])(" + b"|".join(map(re.escape, words)) + rb")(?![\w-])")
    index: dict[str, tuple] = {}
    for files in texts.values():
        dirs = {os.path.dirname(path) for path, text in files.items()
                if any(w in text for w in words) and spelt.search(text)}
        own: dict[str, tuple] = {}
        for path in sorted(Path(p) for p in files
                           if p.endswith(".yaml") and os.path.dirname(p) in dirs):
            _add(own, _load(path))
        index.update(own)
    return index


def _load(path: Path, depth: int = 0) -> dict:
    """A task file's config with its `include` templates merged under it, as lm-eval merges."""
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=TaskYamlLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    if not isinstance(doc, dict):
        return {}
    includes = doc.pop("include", None)
    merged: dict = {}
    for inc in [includes] if isinstance(includes, str) else includes or []:
        if isinstance(inc, str) and depth < 8:
            merged.update(_load(path.parent / inc if not Path(inc).is_absolute() else Path(inc),
                                depth + 1))
    return {**merged, **doc}


def _add(index: dict[str, tuple], cfg: dict) -> None:
    """A task file's entries: its task (and the task's tags), group, or Python task."""
    if "class" in cfg and isinstance(cfg.get("task"), str):
        index.setdefault(cfg["task"], ("python", None))
    elif isinstance(cfg.get("group"), str):
        index.setdefault(cfg["group"], ("group", cfg))
    elif isinstance(cfg.get("task"), str):
        if cfg["task"] in index:
            return
        index[cfg["task"]] = ("task", cfg)
        tags = cfg.get("tag")
        for tag in [tags] if isinstance(tags, str) else tags or []:
            kind, members = index.setdefault(tag, ("tag", []))
            if kind == "tag":
                members.append(cfg["task"])


def _walk(names: list[str], index: dict[str, tuple]) -> tuple[list[tuple[str, dict]], set[str]]:
    """([(task, config)] of the tasks `names` run, with their groups' overrides; the names
    (tasks, groups, tags) not in `index`)."""
    found: list[tuple[str, dict]] = []
    unknown: set[str] = set()

    def visit(name: str, overrides: dict, depth: int) -> None:
        kind, value = index.get(name, (None, None))
        if kind is None:
            unknown.add(name)
        elif kind == "task":
            found.append((name, {**value, **overrides}))
        elif kind == "tag" and depth < 16:
            for task in value:
                visit(task, overrides, depth + 1)
        elif kind == "group" and depth < 16:
            members(value, overrides, depth)

    def members(group: dict, overrides: dict, depth: int) -> None:
        overrides = {**_data_keys(group), **overrides}
        listed = group.get("task")
        for item in listed if isinstance(listed, list) else []:
            if isinstance(item, str):
                visit(item, overrides, depth + 1)
            elif isinstance(item, dict):
                key = "group" if "group" in item else "task"
                inner = {**overrides, **_data_keys(item)}
                if item.get(key) in index:
                    visit(item[key], inner, depth + 1)
                elif key == "group":
                    members(item, overrides, depth + 1)  # a group defined inline
                elif isinstance(item.get("task"), str):
                    found.append((item["task"], inner))  # a task defined inline

    for name in names:
        visit(name, {}, 0)
    return found, unknown


def _data_keys(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k in DATA_KEYS}


def _hub_data(task: str, cfg: dict) -> HubData | None:
    """The Hub dataset a task's config reads, or None: a custom loader, a Python task, a
    builder of local files, a local directory."""
    path, kwargs = cfg.get("dataset_path"), cfg.get("dataset_kwargs") or {}
    if cfg.get("custom_dataset") or "class" in cfg or not isinstance(path, str) \
            or not isinstance(kwargs, dict):
        return None
    if path in LOCAL_FILE_BUILDERS or os.path.isdir(path) or path in _packaged_builders():
        return None
    name = cfg.get("dataset_name")
    dropped = NOT_BUILDER_KWARGS + (("trust_remote_code",) if _datasets_4() else ())
    kwargs = {k: v for k, v in kwargs.items() if k not in dropped}
    return HubData(task, path, None if name is None else str(name),
                   json.dumps(kwargs, sort_keys=True, default=str))


def _datasets_4() -> bool:
    """Whether the datasets library is 4.0 or later, where lm-eval drops trust_remote_code from
    a task's dataset_kwargs (those versions run no loading scripts)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("datasets").split(".")[0]) >= 4
    except (PackageNotFoundError, ValueError):
        return True


def _packaged_builders() -> set[str]:
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:
        return set(LOCAL_FILE_BUILDERS)
    return set(_PACKAGED_DATASETS_MODULES) | set(LOCAL_FILE_BUILDERS)


# -- whether the cache holds them --------------------------------------------------------------

def uncached(wanted: list[HubData]) -> dict[HubData, str]:
    """{dataset: what the datasets library said} for each one the local cache cannot give,
    asked as lm-eval asks (load_dataset_builder), in offline mode."""
    if not wanted:
        return {}
    import datasets

    missing, verdicts = {}, {}
    with _offline_datasets():
        for data in wanted:
            key = (data.path, data.name, data.kwargs)
            if key not in verdicts:
                try:
                    datasets.load_dataset_builder(data.path, data.name, **json.loads(data.kwargs))
                    verdicts[key] = None
                except ConnectionError:  # nothing of it cached
                    verdicts[key] = ""
                except Exception as err:  # e.g. another config cached: the library says which
                    verdicts[key] = "; ".join(str(err).split("\n"))
            if verdicts[key] is not None:
                missing[data] = verdicts[key]
    return missing


@contextlib.contextmanager
def _offline_datasets():
    """The datasets library (and the Hub's client) in offline mode, quiet, for this block."""
    import datasets
    from huggingface_hub import constants

    saved = (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE,
             datasets.utils.logging.get_verbosity())
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    datasets.utils.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved[:2]
        datasets.utils.logging.set_verbosity(saved[2])
