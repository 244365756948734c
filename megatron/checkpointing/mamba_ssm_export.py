"""Exporting a Mamba checkpoint in the `mamba_ssm` package's format, as GPT-NeoX's
tools/ckpts/convert_neox_to_mamba_ssm.py writes it:

    <out>/config.json         mamba_ssm's MambaConfig as a dict: d_model, n_layer, vocab_size
                              (our padded vocabulary), ssm_cfg (expand where the channels are
                              not 2 * d_model), rms_norm, residual_in_fp32 (false: our residual
                              stream is in the model's dtype), fused_add_norm, tie_embeddings
    <out>/pytorch_model.bin   MambaLMHeadModel's state dict: backbone.embedding.weight,
                              backbone.layers.<i>.norm.weight, backbone.layers.<i>.mixer.*,
                              backbone.norm_f.weight, lm_head.weight

`MambaLMHeadModel.from_pretrained(<out>)` loads it. The model must be one Hugging Face's
Mamba can hold too (hf_mamba.py: Mamba layers only, RMSNorm, no position embedding), which
is mamba_ssm's Mamba-1 model with its default state, convolution and dt_rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from megatron.model.config import ModelConfig
from megatron.model.hf_mamba import hf_state_dict


def mamba_ssm_config(config: ModelConfig) -> dict:
    expand = config.mamba_inner_size // config.hidden_size
    return {"d_model": config.hidden_size, "d_intermediate": 0, "n_layer": config.num_layers,
            "vocab_size": config.padded_vocab_size,
            "ssm_cfg": {} if expand == 2 else {"expand": expand}, "attn_layer_idx": [],
            "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": False,
            "fused_add_norm": True, "pad_vocab_size_multiple": 1,
            "tie_embeddings": config.tied_embeddings}


def mamba_ssm_state_dict(canonical: dict[str, torch.Tensor], config: ModelConfig
                         ) -> dict[str, torch.Tensor]:
    """mamba_ssm's tensor names -> tensors (Hugging Face's, with its `embedding` name)."""
    out = {}
    for name, tensor in hf_state_dict(canonical, config).items():
        name = name.replace("backbone.embeddings.", "backbone.embedding.")
        out[name] = tensor.contiguous().clone()
    return out


def write_mamba_ssm(canonical: dict[str, torch.Tensor], config: ModelConfig, output_dir: Path,
                    dtype: torch.dtype) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.to(dtype) for k, v in mamba_ssm_state_dict(canonical, config).items()}
    torch.save(state, output_dir / "pytorch_model.bin")
    (output_dir / "config.json").write_text(json.dumps(mamba_ssm_config(config), indent=2) + "\n")
