#!/usr/bin/env python
"""Export a checkpoint (any tensor/pipeline-parallel layout, any ZeRO stage) as a Hugging Face
model directory: GPTNeoXForCausalLM for GPT-NeoX/Pythia-style models, LlamaForCausalLM for
Llama-style ones (RMSNorm, gated MLP, rotary on whole heads, grouped-query attention allowed),
MixtralForCausalLM for Llama-style mixtures of experts, MambaForCausalLM for Mamba models; or
with --architecture mamba_ssm a Mamba model in the mamba_ssm package's format (config.json and
pytorch_model.bin, as GPT-NeoX's convert_neox_to_mamba_ssm.py writes).

    python tools/ckpts/convert_neox_to_hf.py --input_dir checkpoints/tiny/global_step200 \\
        --config_file configs/tiny.yml --output_dir hf/tiny
    python tools/ckpts/convert_neox_to_hf.py --input_dir checkpoints/tiny --iteration 100 \\
        --output_dir hf/tiny_100 --overwrite
    python tools/ckpts/convert_neox_to_hf.py --input_dir checkpoints/tiny_llama \\
        --config_file configs/tiny_llama.yml --output_dir hf/tiny_llama --precision bf16

--input_dir is a checkpoint directory, or a save directory (its --iteration N, else the
checkpoint its `latest` names, is exported); --output_dir defaults to <save>/hf/global_step<N>,
beside the checkpoint. It must not be a checkpoint, a save directory or the input directory,
and an existing non-empty one is refused unless --overwrite, which first removes the earlier
export's model, weight and tokenizer files there. --config_file (default: the checkpoint's own config.yml,
whose relative vocab_file / merge_file are read from the current directory) gives the model and
the tokenizer. --architecture auto picks the Hugging Face class that holds the model;
--precision auto keeps the dtype the checkpoint stores its weights in. --pad_token_id
(GPT-NeoX's --pad-token-id) sets the pad id of the config and tokenizer. The result loads with
`transformers.AutoModelForCausalLM.from_pretrained(output_dir)` and AutoTokenizer (a reward
model: AutoModelForSequenceClassification).
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
    parser.add_argument("--input_dir", required=True,
                        help="<save>/global_step<N> (or <save>, for the checkpoint `latest` names)")
    parser.add_argument("--iteration", type=int, default=None,
                        help="N of global_step<N>: export that checkpoint of the save directory "
                             "--input_dir (default: the one `latest` names)")
    parser.add_argument("--config_file", nargs="+", default=None,
                        help="config YAML file(s), merged left to right (default: the "
                             "checkpoint's config.yml, or the configs GPT-NeoX saved beside it)")
    parser.add_argument("--output_dir", default=None,
                        help="Hugging Face model directory to write (default: "
                             "<save>/hf/global_step<N>, beside the checkpoint)")
    parser.add_argument("--overwrite", action="store_true",
                        help="export into an existing non-empty --output_dir, removing the "
                             "earlier export's weights (model*.safetensors, pytorch_model*.bin, "
                             "*.index.json), config.json and tokenizer files first")
    parser.add_argument("--architecture", default="auto",
                        choices=["auto", "neox", "llama", "mixtral", "mamba", "mamba_ssm"],
                        help="the Hugging Face class to write (auto: the one that holds the "
                             "model); mamba_ssm: mamba_ssm's format, for Mamba models")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                        help="dtype of the written weights (auto: the checkpoint's)")
    parser.add_argument("--pad_token_id", "--pad-token-id", type=int, default=None,
                        help="the pad id of the exported config and tokenizer (default: the "
                             "tokenizer's; a reward model whose tokenizer pads with its "
                             "end-of-text token gets a <|padding|> token of its own)")
    args = parser.parse_args(argv)

    def run() -> None:
        from megatron.checkpointing.hf_export import export_to_hf
        from megatron.neox_arguments import NeoXArgs

        run_args = NeoXArgs.from_ymls(args.config_file) if args.config_file else None
        output_dir = Path(args.output_dir) if args.output_dir else None
        export_to_hf(Path(args.input_dir), run_args, output_dir, args.architecture,
                     args.precision, iteration=args.iteration, overwrite=args.overwrite,
                     pad_token_id=args.pad_token_id)

    return run_entry(run)


if __name__ == "__main__":
    sys.exit(main())
