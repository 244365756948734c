"""Train a GPT model; runs on every worker. Start it through the launcher:

    python deepy.py train.py configs/tiny.yml
    python deepy.py train.py configs/125M.yml configs/local_setup.yml
"""

import sys

from megatron.entry import exit_process, run_entry
from megatron.launcher import worker_args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv

    def run() -> None:
        from megatron.training.loop import pretrain

        pretrain(worker_args(argv))

    return run_entry(run)


if __name__ == "__main__":
    exit_process(main())
