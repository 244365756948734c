#!/usr/bin/env python
r"""Tokenize documents into token files and a label file whose first part carries no loss, for
models without a chat template; GPT-NeoX's flags, plus prompt/completion records.

    # GPT-NeoX's way: nothing up to and including the first "<|endoftext|>:" carries loss
    python tools/datasets/preprocess_data_with_mask.py --input data.jsonl \
        --tokenizer-type HFTokenizer --vocab-file tokenizer.json --append-eod \
        --mask-before-token 0,25 --output-prefix data/sft/train
    # prompt/completion records: {"prompt": "...", "completion": "..."}
    python tools/datasets/preprocess_data_with_mask.py --input pairs.jsonl \
        --prompt-key prompt --completion-key completion \
        --tokenizer-type HFTokenizer --vocab-file tokenizer.json --append-eod \
        --output-prefix data/sft/train
    # writes data/sft/train_text_document and data/sft/train_label_document

--ftfy fixes each text with ftfy.fix_text before tokenizing; it and .zst inputs need
`pip install -r requirements/requirements-data.txt`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from megatron.data.mask_preprocess import MaskRule, preprocess_masked  # noqa: E402
from megatron.data.preprocess import FixedTextTokenizer  # noqa: E402
from megatron.entry import run_entry  # noqa: E402
from megatron.tokenizer import TOKENIZERS, build_tokenizer  # noqa: E402


def token_ids(text: str) -> tuple[int, ...]:
    """'50256, 27' -> (50256, 27); as GPT-NeoX, characters other than digits are dropped."""
    ids = [re.sub(r"\D", "", part) for part in text.split(",")]
    if not all(ids):
        raise ValueError(f"--mask-before-token {text!r} is not a comma-separated list of ids")
    return tuple(int(i) for i in ids)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    group = parser.add_argument_group("input data")
    group.add_argument("--input", required=True,
                       help="jsonl(.gz/.zst), json.zst or txt files or folders, "
                            "comma-separated")
    group.add_argument("--jsonl-keys", nargs="+", default=["text"],
                       help="jsonl fields to tokenize (the label file follows the first)")
    group.add_argument("--mask-before-token", default=None,
                       help="token ids, comma-separated: no loss up to and including them")
    group.add_argument("--prompt-key", default=None, help="jsonl field of the prompt (no loss)")
    group.add_argument("--completion-key", default=None,
                       help="jsonl field of the completion (carries loss)")
    group.add_argument("--num-docs", type=int, default=None,
                       help="number of documents, for the progress bar")
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-type", required=True, choices=sorted(TOKENIZERS))
    group.add_argument("--vocab-file", default=None, help="tokenizer vocab / JSON file")
    group.add_argument("--merge-file", default=None, help="BPE merges file")
    group.add_argument("--append-eod", action="store_true",
                       help="append the end-of-document token (it carries loss)")
    group.add_argument("--ftfy", action="store_true",
                       help="fix each text with ftfy.fix_text before tokenizing")
    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", required=True,
                       help="writes {prefix}_{key}_document and {prefix}_label_document")
    group.add_argument("--dataset-impl", default="mmap", choices=["mmap"])
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, default=1,
                       help="tokenizer processes (one core each); the output is the same")
    group.add_argument("--log-interval", type=int, default=1000,
                       help="log the progress every this many documents (0: never)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, not {args.workers}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    rule = MaskRule(mask_before=token_ids(args.mask_before_token) if args.mask_before_token
                    else (), prompt_key=args.prompt_key, completion_key=args.completion_key,
                    append_eod=args.append_eod)
    tokenizer = build_tokenizer(args.tokenizer_type, args.vocab_file, args.merge_file)
    if args.ftfy:
        tokenizer = FixedTextTokenizer(tokenizer)
    result = preprocess_masked(args.input, args.output_prefix, tokenizer, rule, args.jsonl_keys,
                               num_docs=args.num_docs, workers=args.workers,
                               log_interval=args.log_interval)
    for name, prefix in result.prefixes.items():
        print(f"{name}: {prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(run_entry(main))
