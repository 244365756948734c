"""eval_tasks during training (GPT-NeoX's behaviour): a two-process `configs/tiny.yml` run with
local lm-eval tasks (its workers forked in-process, tests/runs.py) scores them at every
evaluation. What a user relies on: the metrics appear
at each eval_interval and at the end, in metrics.jsonl and on one console line; they equal what
eval.py reports for the checkpoint of that iteration; and the training itself (its losses) is
exactly the run without eval_tasks."""

from __future__ import annotations

import json

import pytest

from megatron.evaluation.during_training import refusal
from megatron.neox_arguments import NeoXArgs
from tests.runs import ROOT, explain, free_port, launch_in_process, tiny_overrides

TASKS = ROOT / "tests" / "evaluation" / "tasks"
RUN = dict(train_iters=10, eval_interval=5, eval_iters=1, log_interval=1, checkpoint_factor=10)
TASK_KEYS = [f"eval_tasks=[{TASKS / 'tiny_mc.yaml'}, {TASKS / 'tiny_rolling.yaml'}]",
             "eval_bootstrap_iters=0", "eval_batch_size=2"]


def records(run):
    return [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_tasks_run_at_each_evaluation_and_leave_training_unchanged(small_data, tmp_path):
    with_tasks, plain = tmp_path / "with_tasks", tmp_path / "plain"
    proc = launch_in_process("train.py", "configs/tiny.yml",
                             *tiny_overrides(*small_data, with_tasks, **RUN), *TASK_KEYS)
    assert proc.returncode == 0, explain(proc)
    assert " lm-eval at iteration 5 | tiny_mc acc " in proc.stdout, explain(proc)
    assert " lm-eval at iteration 10 | tiny_mc acc " in proc.stdout
    scored = {r["iteration"]: r for r in records(with_tasks) if "eval/tiny_mc/acc" in r}
    assert sorted(scored) == [5, 10]
    assert "eval/tiny_rolling/word_perplexity" in scored[10]

    reference = launch_in_process("train.py", "configs/tiny.yml",
                                  *tiny_overrides(*small_data, plain, **RUN))
    assert reference.returncode == 0, explain(reference)
    losses = {r["iteration"]: r["lm_loss"] for r in records(with_tasks) if "lm_loss" in r}
    assert losses == {r["iteration"]: r["lm_loss"] for r in records(plain) if "lm_loss" in r}

    # eval.py on the checkpoint of iteration 10 reports the same figures
    results = tmp_path / "results" / "tiny"
    proc = launch_in_process("eval.py", "configs/tiny.yml",
                             *tiny_overrides(*small_data, with_tasks, **RUN), *TASK_KEYS,
                             f"eval_results_prefix={results}", f"log_dir={tmp_path / 'eval'}",
                             f"master_port={free_port()}")
    assert proc.returncode == 0, explain(proc)
    (path,) = results.parent.glob("tiny_eval_results_*.json")
    written = json.loads(path.read_text())["results"]
    assert scored[10]["eval/tiny_mc/acc"] == pytest.approx(written["tiny_mc"]["acc,none"])
    assert scored[10]["eval/tiny_rolling/word_perplexity"] == pytest.approx(
        written["tiny_rolling"]["word_perplexity,none"], rel=1e-5)


@pytest.mark.parametrize("keys,fragment", [
    (["pipe_parallel_size=2"], "but pipe_parallel_size is 2: run the tasks on a checkpoint"),
    (["pipe_parallel_size=0", "zero_optimization={stage: 3}"], "which ZeRO stage 3 partitions"),
])
def test_layouts_that_cannot_score_during_training_are_refused(keys, fragment):
    args = NeoXArgs.from_ymls(["configs/tiny.yml"], [f"eval_tasks=[{TASKS / 'tiny_mc.yaml'}]",
                                                     *keys])
    assert fragment in refusal(args)
    assert refusal(NeoXArgs.from_ymls(["configs/tiny.yml"], keys)) is None
