"""Offline, an lm-eval task whose Hub dataset is not in the local datasets cache is refused
before the model loads: by deepy.py before any worker starts, or (a hostfile launch, whose
workers read their own caches) by the workers; a task whose dataset is cached still runs.

The tasks are lm-eval's own (its registry files, its loading through the datasets library);
a cached Hub dataset is written by the datasets library's own builder into the cache's layout
for that repository (`<namespace>___<name>/<config>/<version>/<hash>`)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from megatron.evaluation.task_data import HubData, hub_datasets, uncached
from tests.runs import ROOT, deepy, explain, free_port

TASKS = ROOT / "tests/evaluation/tasks"
LAMBADA = HubData("lambada_openai", "EleutherAI/lambada_openai", "default", "{}")
MODEL_LOADED = "[megatron.text_generation.runtime] loaded "  # the workers' line after the load
LAUNCHED = "launching 2 worker(s)"


def cache_hub_dataset(cache: Path, repo_id: str, config: str, rows: list[dict]) -> None:
    """`repo_id`'s `config` in the datasets cache `cache`, as a download would leave it (one
    test split), written by the datasets library's JSON builder."""
    from datasets.packaged_modules.json.json import Json

    cache.mkdir(parents=True, exist_ok=True)
    source = cache.parent / f"{repo_id.replace('/', '_')}.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    name = repo_id.split("/")[-1]
    builder = Json(cache_dir=str(cache), dataset_name=name, config_name=config, config_id=config,
                   hash="0123abcd", data_files={"test": [str(source)]})
    builder.download_and_prepare()
    target = cache / repo_id.replace("/", "___") / config / "0.0.0" / "0123abcd"
    target.parent.mkdir(parents=True)
    shutil.move(builder.cache_dir, target)
    shutil.rmtree(cache / name)


LAMBADA_ROWS = [{"text": t} for t in ("the cat sat on the mat", "a dog ran to the park",
                                      "one two three four", "hello to the big world")]


def test_the_hub_datasets_are_read_from_the_task_files_as_lm_eval_reads_them(tmp_path):
    """A task, a group of groups of tags (mmlu), a tag set in a template (ai2_arc); a local
    task, and a local one that takes a registry task's name (the include path wins, as in
    lm-eval); a local group of a registry task and a task defined inline."""
    assert hub_datasets(["lambada_openai"], []) == [LAMBADA]
    mmlu = hub_datasets(["mmlu"], [])
    assert len(mmlu) == 57 and {d.path for d in mmlu} == {"cais/mmlu"}
    assert HubData("mmlu_anatomy", "cais/mmlu", "anatomy", "{}") in mmlu
    assert sorted((d.task, d.name) for d in hub_datasets(["ai2_arc"], [])) == [
        ("arc_challenge", "ARC-Challenge"), ("arc_easy", "ARC-Easy")]
    assert hub_datasets(["tiny_mc", "tiny_rolling"], [str(TASKS)]) == []  # local files
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "lambada.yaml").write_text((TASKS / "tiny_mc.yaml").read_text().replace(
        "task: tiny_mc", "task: lambada_openai"))
    assert hub_datasets(["lambada_openai"], [str(mine)]) == []
    (mine / "suite.yaml").write_text(
        "group: my_suite\ntask:\n  - hellaswag\n"
        "  - {task: my_inline, dataset_path: org/inline_set, dataset_name: small}\n")
    assert hub_datasets(["my_suite"], [str(mine)]) == [
        HubData("hellaswag", "Rowan/hellaswag", None, "{}"),
        HubData("my_inline", "org/inline_set", "small", "{}")]


def test_the_cache_is_asked_as_lm_eval_asks_it_offline(tmp_path, monkeypatch):
    """A cached config is found, another config of it and an uncached dataset are not; the
    datasets library's offline setting is as it was after."""
    import datasets

    cache = tmp_path / "datasets"
    cache_hub_dataset(cache, "EleutherAI/lambada_openai", "default", LAMBADA_ROWS)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    before = datasets.config.HF_HUB_OFFLINE
    other_config = HubData("lambada_openai_mt_de", "EleutherAI/lambada_openai", "de", "{}")
    hellaswag = HubData("hellaswag", "Rowan/hellaswag", None, "{}")
    missing = uncached([LAMBADA, other_config, hellaswag])
    assert missing == {
        other_config: "Couldn't find cache for EleutherAI/lambada_openai for config 'de'; "
                      "Available configs in the cache: ['default']",
        hellaswag: ""}
    assert datasets.config.HF_HUB_OFFLINE == before


def eval_run(trained, tmp_path: Path, tasks: str, *extra: str, offline: dict[str, str]):
    """eval.py through deepy.py with the cache in tmp_path/hf and the `offline` settings
    (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE)."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf/datasets"),
           **offline}
    return deepy("eval.py", str(ROOT / "configs/tiny.yml"), *trained["overrides"],
                 f"eval_tasks={tasks}", "eval_limit=2", f"log_dir={tmp_path / 'logs'}",
                 f"eval_results_prefix={tmp_path / 'results/r'}", f"master_port={free_port()}",
                 *extra, env=env)


def test_offline_deepy_refuses_an_uncached_hub_dataset_before_any_worker_and_runs_a_cached_one(
        trained, tmp_path):
    """HF_HUB_OFFLINE=1, a cache holding lambada_openai's dataset but not hellaswag's: one
    error line from deepy.py naming hellaswag, its dataset and the cache, and no worker; then
    lambada_openai alone runs to its results, from the cache."""
    cache = tmp_path / "hf" / "datasets"
    cache_hub_dataset(cache, "EleutherAI/lambada_openai", "default", LAMBADA_ROWS)
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": ""}
    proc = eval_run(trained, tmp_path, "[lambada_openai, hellaswag]", offline=offline)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert proc.returncode == 1 and errors == [
        "error: lm-eval task hellaswag reads Rowan/hellaswag from the Hugging Face Hub: not in "
        f"the local datasets cache ({cache}), and the workers run offline (HF_HUB_OFFLINE=1). "
        "Download where the Hub can be reached, with the same HF_HOME (e.g. python -c \"import "
        "datasets; datasets.load_dataset('Rowan/hellaswag')\", or this eval run there once), "
        "then copy that cache here or point HF_DATASETS_CACHE at it; or evaluate a local task "
        "YAML that reads local files (dataset_path: json)"], explain(proc)
    assert LAUNCHED not in proc.stderr and MODEL_LOADED not in proc.stderr, explain(proc)

    proc = eval_run(trained, tmp_path, "[lambada_openai]", offline=offline)
    assert proc.returncode == 0 and MODEL_LOADED in proc.stderr, explain(proc)
    (written,) = (tmp_path / "results").glob("r_eval_results_*.json")
    results = json.loads(written.read_text())["results"]["lambada_openai"]
    assert 0.0 <= results["acc,none"] <= 1.0 and results["perplexity,none"] > 1.0


def test_the_workers_of_a_hostfile_launch_refuse_an_uncached_dataset_before_the_model_loads(
        trained, tmp_path):
    """With a hostfile deepy.py leaves the cache to the workers (other nodes have their own):
    each refuses with the same line after building lm-eval's registry, before the load."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    proc = eval_run(trained, tmp_path, "[lambada_openai]", f"hostfile={hostfile}",
                    offline={"HF_HUB_OFFLINE": "", "HF_DATASETS_OFFLINE": "1"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert proc.returncode == 1 and len(errors) == 1, explain(proc)
    # both ranks, or the first to meet it (the other may be stopped before it does)
    assert re.match(r"error \(ranks? (0-1|0|1) on ", errors[0]) and errors[0].endswith(
        "): lm-eval task lambada_openai reads EleutherAI/lambada_openai (config default) from "
        f"the Hugging Face Hub: not in the local datasets cache ({tmp_path / 'hf/datasets'}), "
        "and the workers run offline (HF_DATASETS_OFFLINE=1). Download where the Hub can be "
        "reached, with the same HF_HOME (e.g. python -c \"import datasets; datasets.load_dataset"
        "('EleutherAI/lambada_openai', 'default')\", or this eval run there once), then copy "
        "that cache here or point HF_DATASETS_CACHE at it; or evaluate a local task YAML that "
        "reads local files (dataset_path: json)"), explain(proc)
    assert LAUNCHED in proc.stderr and MODEL_LOADED not in proc.stderr, explain(proc)


@pytest.mark.parametrize("entry", [str(TASKS / "tiny_mc.yaml"), str(TASKS)])
def test_local_task_files_are_not_looked_up(entry):
    """Task files that read local files: decided from eval_tasks alone, nothing imported."""
    from types import SimpleNamespace

    from megatron.evaluation.task_data import check_offline_data

    ev = SimpleNamespace(eval_tasks=[entry], eval_include_path=None)
    check_offline_data(ev, {"HF_HUB_OFFLINE": "1"})
