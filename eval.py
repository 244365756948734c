r"""Score a trained checkpoint on lm-eval tasks (runs on every worker); start it with the launcher:

    python deepy.py eval.py configs/tiny.yml eval_tasks='[lambada_openai, hellaswag]'
    python deepy.py eval.py configs/tiny.yml eval_tasks='[path/to/my_task.yaml]' eval_limit=50
    python deepy.py eval.py configs/tiny.yml eval_tasks='[my_task]' \
        eval_include_path='[path/to/task_dir]' eval_results_prefix=results/tiny

Needs lm-eval (pip install -r requirements/requirements-eval.txt). Reads the checkpoint in
`load` (latest, or `iteration`); model_parallel_size ranks cooperate on each forward, the other
ranks are replicas that split the requests. Rank 0 writes
{eval_results_prefix}_eval_results_<date>.json (no prefix: <log_dir>/eval/eval_results_<date>.json)
and logs the metrics to the configured trackers.
Task names, local task files and directories: see megatron/evaluation/tasks.py.
"""

import sys

from megatron.entry import exit_process, run_entry
from megatron.launcher import worker_args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv

    def run() -> None:
        from megatron.evaluation.run import run_evaluation

        run_evaluation(worker_args(argv))

    return run_entry(run)


if __name__ == "__main__":
    exit_process(main())
