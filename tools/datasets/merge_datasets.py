#!/usr/bin/env python
r"""Concatenate GPT-NeoX `.bin`/`.idx` token files into one dataset.

    python tools/datasets/merge_datasets.py \
        --datasets data/a_text_document data/b_text_document --output-prefix data/ab_text_document
    python tools/datasets/merge_datasets.py --datasets data/shards/ --output-prefix data/all

A directory stands for every dataset (`*.idx`) inside it, in name order; one that holds label
or reward files beside token files is refused. `--input DIR` (GPT-NeoX's flag) is
`--datasets DIR`.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from megatron.data.merge import merge_datasets  # noqa: E402
from megatron.entry import run_entry  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", "--input", nargs="+", required=True,
                        help="dataset prefixes (path without .bin/.idx) or directories "
                             "(--input: GPT-NeoX's name, for its one directory)")
    parser.add_argument("--output-prefix", required=True, help="prefix of the merged dataset")
    args = parser.parse_args(argv)

    def run() -> None:
        merge_datasets(args.datasets, args.output_prefix)

    return run_entry(run)


if __name__ == "__main__":
    sys.exit(main())
