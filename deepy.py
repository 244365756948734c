"""Launch a script on every worker of a run with the resolved config.

    python deepy.py train.py configs/125M.yml configs/local_setup.yml
    python deepy.py train.py configs/tiny.yml train_iters=50 num_gpus=1
    python deepy.py generate.py configs/tiny.yml configs/text_generation.yml
    python deepy.py eval.py configs/tiny.yml --eval_tasks lambada_openai

Config files merge left to right; `key=value` (or `--key value`) overrides come last.
"""

import sys

from megatron.entry import exit_process, run_entry
from megatron.launcher import launch


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    return run_entry(lambda: launch(argv[0], argv[1:]))


if __name__ == "__main__":
    exit_process(main())
