#!/usr/bin/env python
"""Download or build a ready-to-train dataset: token files plus the tokenizer they need.

    # Offline: Python's own documentation (~1.6 MB), a byte-level BPE (vocab 8192) trained on it,
    # and data/builtin/builtin_text_document.{bin,idx}. Use with
    #   data_path: data/builtin/builtin_text_document
    #   tokenizer_type: HFTokenizer, vocab_file: data/builtin/tokenizer.json
    python tools/datasets/prepare_data.py builtin -d data

    # enwik8 (downloads 36 MB from mattmahoney.net), byte-level (CharLevelTokenizer):
    python tools/datasets/prepare_data.py enwik8 -d data

Finished steps are reused on a second run; --force redoes everything.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from megatron.data.prepare import BUILTIN_VOCAB_SIZE, RECIPES, prepare_dataset  # noqa: E402
from megatron.entry import run_entry  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset", choices=sorted(RECIPES), help="which dataset to prepare")
    parser.add_argument("-d", "--data-dir", default="data", help="parent folder of the output")
    parser.add_argument("--force", action="store_true", help="redo every step")
    parser.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    parser.add_argument("--vocab-size", type=int, default=BUILTIN_VOCAB_SIZE,
                        help="BPE vocabulary size (builtin only)")
    parser.add_argument("--max-documents", type=int, default=None,
                        help="keep only the first N corpus documents (builtin only)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)

    def run() -> None:
        kwargs = {"force": args.force, "workers": args.workers}
        if args.dataset == "builtin":
            kwargs.update(vocab_size=args.vocab_size, max_documents=args.max_documents)
        result = prepare_dataset(args.dataset, args.data_dir, **kwargs)
        print(f"data_path: {result.data_prefix}")
        print(f"tokenizer_type: {result.tokenizer_type}")
        if result.vocab_file:
            print(f"vocab_file: {result.vocab_file}")

    return run_entry(run)  # a user error: one line, status 1


if __name__ == "__main__":
    sys.exit(main())
