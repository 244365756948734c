#!/usr/bin/env python
r"""Render conversations with a tokenizer's chat template into token and label files (SFT, DPO,
KTO, reward models), with GPT-NeoX's flags.

    python tools/datasets/preprocess_data_with_chat_template.py \
        --input data/chats.jsonl --jsonl-keys messages \
        --tokenizer-path checkpoints/my_hf_model --output-prefix data/sft/train
    # writes data/sft/train_messages_document (tokens) and ..._messages_label_document (labels);
    # train with train_data_paths / train_label_data_paths naming them (docs/posttraining.md)

Each jsonl line holds, under every --jsonl-keys key, a list of {"role", "content"} messages.
Only the turns of --generation-role (default assistant) carry loss; --only-last keeps only the
last turn's; --for-rm writes the reward-model format; --reward-key adds a reward file (KTO).
--ftfy runs each message's content through ftfy.fix_text before the template renders it (it and
.zst inputs need `pip install -r requirements/requirements-data.txt`).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from megatron.data.chat_preprocess import ChatOptions, preprocess_chat  # noqa: E402
from megatron.entry import run_entry  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    group = parser.add_argument_group("input data")
    group.add_argument("--input", required=True,
                       help="jsonl(.gz/.zst) files or folders, comma-separated")
    group.add_argument("--jsonl-keys", nargs="+", default=["conversation"],
                       help="keys holding a conversation, one output per key")
    group.add_argument("--no-mask", action="store_true",
                       help="every token carries loss (no label file is written)")
    group.add_argument("--for-rm", action="store_true",
                       help="reward-model format: the conversation then two EOS tokens, only the "
                            "second a label")
    group.add_argument("--generation-role", default="assistant",
                       help="the role whose turns carry loss")
    group.add_argument("--only-last", action="store_true",
                       help="only the last turn carries loss")
    group.add_argument("--reward-key", default=None,
                       help="jsonl key of a reward per conversation (KTO): writes a reward file")
    group.add_argument("--binary-reward", action="store_true",
                       help="the reward is true/false, written as +1 / -1")
    group.add_argument("--num-docs", type=int, default=None,
                       help="number of conversations, for the progress bar")
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-path", required=True,
                       help="a Hugging Face tokenizer directory that has a chat template")
    group.add_argument("--ftfy", action="store_true",
                       help="fix each message's content with ftfy.fix_text before rendering")
    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", required=True,
                       help="writes {prefix}_{key}_document, _label_document, _reward_document")
    group.add_argument("--dataset-impl", default="mmap", choices=["mmap"])
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, default=1,
                       help="processes rendering conversations")
    group.add_argument("--log-interval", type=int, default=100,
                       help="log progress every N conversations")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    options = ChatOptions(generation_role=args.generation_role, only_last=args.only_last,
                          for_rm=args.for_rm, no_mask=args.no_mask, ftfy=args.ftfy)
    result = preprocess_chat(args.input, args.output_prefix, args.tokenizer_path,
                             args.jsonl_keys, options, reward_key=args.reward_key,
                             binary_reward=args.binary_reward, num_docs=args.num_docs,
                             workers=args.workers, log_interval=args.log_interval)
    for name, prefix in result.prefixes.items():
        print(f"{name}: {prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(run_entry(main))
