#!/usr/bin/env python
r"""Import a local Hugging Face model directory (GPTNeoXForCausalLM, LlamaForCausalLM,
MixtralForCausalLM or MambaForCausalLM) as a checkpoint that training (finetuning), generation
and evaluation load.

    python tools/ckpts/convert_hf_to_neox.py --hf_model hf/tiny --config_file configs/tiny.yml \
        --output_dir checkpoints/from_hf
    python tools/ckpts/convert_hf_to_neox.py --hf_model hf/tiny_llama \
        --config_file configs/tiny_llama.yml --output_dir checkpoints/from_hf --tp 2 --iteration 0

--hf_model is a directory with config.json and model.safetensors (or sharded safetensors with
their index, or pytorch_model.bin); nothing is downloaded. --config_file describes the same
model and its tokenizer (every differing key is reported). The checkpoint is written as
<output_dir>/global_step<iteration>/ split for --tp tensor-parallel ranks (default: the
config's model_parallel_size), with <output_dir>/latest naming it. An --output_dir that already
holds a checkpoint at --iteration or later is refused (the next run would resume from the
import): choose another --output_dir or a later --iteration.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from megatron.entry import run_entry  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf_model", required=True, help="local Hugging Face model directory")
    parser.add_argument("--config_file", nargs="+", required=True,
                        help="config YAML file(s) describing the model, merged left to right")
    parser.add_argument("--output_dir", required=True, help="save directory to write into")
    parser.add_argument("--tp", type=int, default=None,
                        help="tensor-parallel degree to split for, at least 1 (default: the "
                        "config's)")
    parser.add_argument("--iteration", type=int, default=0,
                        help="N of global_step<N>, 0 or more (default: 0)")
    args = parser.parse_args(argv)

    def run() -> None:
        from megatron.checkpointing.hf_import import import_from_hf
        from megatron.neox_arguments import NeoXArgs

        import_from_hf(Path(args.hf_model), NeoXArgs.from_ymls(args.config_file),
                       Path(args.output_dir), args.tp, args.iteration)

    return run_entry(run)


if __name__ == "__main__":
    sys.exit(main())
