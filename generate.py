"""Sample text from a trained checkpoint (runs on every worker). Start it through the launcher:

    python deepy.py generate.py configs/tiny.yml configs/text_generation.yml

Text generation is not available in this version yet: the script refuses with that message
rather than doing something partial.
"""

import sys

from megatron.entry import run_entry
from megatron.launcher import worker_args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv

    def run() -> None:
        worker_args(argv)
        raise RuntimeError("generate.py: text generation is not available in this version yet")

    return run_entry(run)


if __name__ == "__main__":
    sys.exit(main())
