"""Score a trained checkpoint on lm-eval tasks (runs on every worker). Start it through the launcher:

    python deepy.py eval.py configs/tiny.yml --eval_tasks lambada_openai

lm-eval benchmark runs are not available in this version yet: the script refuses with that
message rather than doing something partial.
"""

import sys

from megatron.entry import run_entry
from megatron.launcher import worker_args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv

    def run() -> None:
        worker_args(argv)
        raise RuntimeError("eval.py: lm-eval benchmark runs are not available in this version yet")

    return run_entry(run)


if __name__ == "__main__":
    sys.exit(main())
