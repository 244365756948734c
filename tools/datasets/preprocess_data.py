#!/usr/bin/env python
r"""Tokenize jsonl(.gz/.zst) / json.zst / txt files into GPT-NeoX `.bin`/`.idx` token files.

    python tools/datasets/preprocess_data.py \
        --input data/mydata.jsonl --output-prefix data/mydata \
        --tokenizer-type HFTokenizer --vocab-file data/builtin/tokenizer.json \
        --append-eod --workers 4
    # writes data/mydata_text_document.bin and .idx; train with
    #   data_path: data/mydata_text_document

--input takes files, directories (searched recursively) or a comma-separated list of them. A
jsonl line is an object with a string under each --jsonl-keys key; with the default key (text)
also a bare string, or paragraphs as {"text": [...]}, as lm_dataformat reads them (docs/data.md).
GPT-NeoX's command lines run unchanged, e.g. with a .jsonl.zst input, --num-docs and --ftfy
(.zst inputs and --ftfy need: pip install -r requirements/requirements-data.txt).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from megatron.data.preprocess import preprocess  # noqa: E402
from megatron.entry import run_entry  # noqa: E402
from megatron.tokenizer import TOKENIZERS  # noqa: E402

# GPT-NeoX's --dataset-impl choices; only mmap is written (and read) here
DATASET_IMPLS = ("lazy", "cached", "mmap")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = parser.add_argument_group("input data")
    group.add_argument("--input", required=True,
                       help="jsonl, jsonl.gz, jsonl.zst, json.zst or txt files or folders, "
                            "comma-separated")
    group.add_argument("--jsonl-keys", nargs="+", default=["text"],
                       help="jsonl fields to tokenize, one output per field")
    group.add_argument("--num-docs", type=int, default=None,
                       help="number of documents in the input, the progress bar's total")
    group.add_argument("--max-docs", type=int, default=None, help="stop after N documents")
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-type", required=True, choices=sorted(TOKENIZERS))
    group.add_argument("--vocab-file", default=None, help="tokenizer vocab / JSON file")
    group.add_argument("--merge-file", default=None, help="BPE merges file")
    group.add_argument("--append-eod", action="store_true",
                       help="append the end-of-document token to every document")
    group.add_argument("--ftfy", action="store_true",
                       help="fix each text with ftfy.fix_text before tokenizing")
    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", required=True,
                       help="writes {prefix}_{key}_document.bin/.idx")
    group.add_argument("--dataset-impl", default="mmap", choices=DATASET_IMPLS,
                       help="only mmap (the default) is written here")
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, default=1,
                       help="tokenizer processes, one thread and one core each")
    group.add_argument("--log-interval", type=int, default=1000,
                       help="log progress every N documents")
    return parser.parse_args(argv)


def check_dataset_impl(impl: str) -> None:
    """Refuse GPT-NeoX's older index formats, which training here does not read."""
    if impl != "mmap":
        raise ValueError(f"--dataset-impl {impl} writes GPT-NeoX's older indexed format, which "
                         "this project does not read; use --dataset-impl mmap (the default, "
                         "which GPT-NeoX trains on too)")


def main(argv=None) -> int:
    args = parse_args(argv)

    def run() -> None:
        check_dataset_impl(args.dataset_impl)
        result = preprocess(args.input, args.output_prefix, args.tokenizer_type,
                            args.vocab_file, args.merge_file, jsonl_keys=args.jsonl_keys,
                            append_eod=args.append_eod, workers=args.workers,
                            log_interval=args.log_interval, max_docs=args.max_docs,
                            ftfy=args.ftfy, num_docs=args.num_docs)
        for key, prefix in result.prefixes.items():
            print(f"{key}: {prefix}  ({result.written(key)})")

    return run_entry(run)  # a user error: one line, status 1


if __name__ == "__main__":
    sys.exit(main())
