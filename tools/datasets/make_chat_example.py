#!/usr/bin/env python
"""Write the example chat task of docs/posttraining.md: a chat tokenizer and conversations for
SFT, DPO / reward models and KTO, with no download.

    python tools/datasets/make_chat_example.py --output-dir data/chat
    # data/chat/tokenizer/            the built-in BPE plus role tokens and a chat template
    # data/chat/sft_train.jsonl       {"messages": [...]}, the user names a colour, the
    #                                 assistant the thing of that colour ("cherry!")
    # data/chat/pairs_train.jsonl     {"chosen": [...], "rejected": [...]}: "!" over "."
    # data/chat/kto_train.jsonl       {"messages": [...], "reward": 1 or -1}
    # and *_valid.jsonl for validation
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from megatron.data.chat_example import EXAMPLE_SPLITS, write_example  # noqa: E402
from megatron.entry import run_entry  # noqa: E402

BUILTIN_TOKENIZER = "data/builtin/tokenizer.json"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--output-dir", required=True, help="folder of the tokenizer and jsonl")
    parser.add_argument("--base-tokenizer", default=BUILTIN_TOKENIZER,
                        help="tokenizer.json the chat tokenizer extends (default: the built-in "
                             "dataset's, from `make data`)")
    parser.add_argument("--train-records", type=int, default=EXAMPLE_SPLITS["train"][0],
                        help="conversations (and pairs) in each train file")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not os.path.isfile(args.base_tokenizer):
        hint = (" (build it with `python tools/datasets/prepare_data.py builtin -d data`)"
                if args.base_tokenizer == BUILTIN_TOKENIZER else "")
        raise FileNotFoundError(f"--base-tokenizer {args.base_tokenizer}: no such file{hint}")
    if args.train_records < 1:
        raise ValueError(f"--train-records {args.train_records}: give at least 1")
    for name, path in write_example(args.base_tokenizer, args.output_dir,
                                    args.train_records).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_entry(main))
