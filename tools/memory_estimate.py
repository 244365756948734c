#!/usr/bin/env python
"""Print the memory one worker of a run needs, for any config and layout, starting nothing.

    python tools/memory_estimate.py configs/6-7B.yml configs/local_setup.yml
    python tools/memory_estimate.py configs/6-7B.yml num_gpus=8 model_parallel_size=2 \\
        "zero_optimization={stage: 2}" checkpoint_activations=true
    python tools/memory_estimate.py configs/125M.yml --script generate.py --vocab-size 50257
    python tools/memory_estimate.py configs/20B.yml --world-size 96 --device cuda

Config files and key=value overrides are read as deepy.py reads them. The world size is
num_nodes * num_gpus of the config unless --world-size gives it. The padded vocabulary comes
from the config's tokenizer files, or from --vocab-size when they are not at hand. Every term is
per worker in GiB (2^30 bytes); how each is computed is in megatron/training/memory_estimate.py.
The last line compares the total with what a worker has on this machine (the figure deepy.py
uses); exits 1 when it does not fit, 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))


def positive(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--script", default="train.py", choices=["train.py", "generate.py", "eval.py"])
    parser.add_argument("--vocab-size", type=positive, default=None,
                        help="the tokenizer's vocabulary size, instead of loading its files")
    parser.add_argument("--world-size", type=positive, default=None, help="ranks of the run")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="where the workers compute (default: cuda when this machine has it)")
    options, rest = parser.parse_known_args(argv)
    from megatron.entry import run_entry

    return run_entry(lambda: report(options, rest))


def report(options, rest: list[str]) -> int:
    from megatron.entry import split_command_line
    from megatron.neox_arguments import NeoXArgs
    from megatron.training.memory_check import describe_estimate

    files, overrides = split_command_line(rest)
    if not files:
        raise ValueError("no config file given; usage: python tools/memory_estimate.py "
                         "configs/a.yml [configs/b.yml] [key=value ...]")
    args = NeoXArgs.from_ymls(files, overrides)
    if options.vocab_size is None and not args.tokenizer.vocab_file:
        raise ValueError(f"{args.tokenizer.tokenizer_type} needs vocab_file to tell the vocabulary "
                         "size: set vocab_file=PATH, or pass --vocab-size N (GPT-2's is 50257)")
    if options.world_size is not None:
        args = args.with_world_size(options.world_size)
    lines, fits = describe_estimate(args, options.script, options.vocab_size, options.device)
    print("\n".join(lines))
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
