r"""Sample text from a trained checkpoint (runs on every worker). Start it through the launcher:

    python deepy.py generate.py configs/tiny.yml configs/text_generation.yml
    python deepy.py generate.py configs/tiny.yml configs/text_generation.yml \
        text_gen_type=input-file sample_input_file=prompts.txt sample_output_file=out.jsonl
    echo "Once upon a time" | python deepy.py generate.py configs/tiny.yml \
        configs/text_generation.yml text_gen_type=interactive temperature=0

Reads the checkpoint in `load` (the one `latest` names, or `iteration`), whatever tensor/pipeline
layout wrote it, and writes one JSON line per sample to sample_output_file (default
<log_dir>/samples/samples.jsonl; fields documented in megatron/text_generation/modes.py).
model_parallel_size ranks cooperate on each forward; the other ranks are replicas that split
the prompts.
"""

import sys

from megatron.entry import exit_process, run_entry
from megatron.launcher import worker_args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv

    def run() -> None:
        from megatron.text_generation.modes import run_generation

        run_generation(worker_args(argv))

    return run_entry(run)


if __name__ == "__main__":
    exit_process(main())
