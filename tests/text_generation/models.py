"""Small models for in-process generation/eval tests, and a trained checkpoint shared by the
tests that need real weights (trained once per test session through the launcher)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel
from megatron.model.partition import canonical_from_module
from megatron.text_generation.inference_model import InferenceModel

VARIANTS = {
    "neox": dict(rotary_pct=0.25),
    "pythia_parallel": dict(rotary_pct=0.25, gpt_j_residual=True),
    "llama_gqa": dict(norm="rmsnorm", activation="swiglu", num_kv_heads=2,
                      use_bias_in_attn_linear=False, use_bias_in_mlp=False,
                      use_bias_in_norms=False),
    "alibi_tied": dict(pos_emb="alibi", tied_embeddings=True),
    # Mixtral: llama_gqa with 4 experts in every layer, the normalised top 2 of each token
    "mixtral": dict(norm="rmsnorm", activation="swiglu", num_kv_heads=2,
                    use_bias_in_attn_linear=False, use_bias_in_mlp=False,
                    use_bias_in_norms=False, moe_num_experts=4, moe_top_k=2,
                    moe_router_type="topk", moe_normalize_topk=True),
    # GPT-NeoX's MoE: Sinkhorn-trained, plain top-1 (sigmoid) at inference, every other layer
    "neox_moe": dict(rotary_pct=0.25, moe_num_experts=4, moe_expert_interval=2),
    # Hugging Face's Mamba: Mamba layers only, RMSNorm, no position embedding, tied
    "mamba": dict(attention_types=("mamba", "mamba"), mamba_inner_size=128, norm="rmsnorm",
                  use_bias_in_norms=False, pos_emb="none", tied_embeddings=True,
                  mamba_selective_scan_fusion=True),
    # a Mamba layer before an attention layer (GPT-NeoX's attention_config mixes them)
    "mamba_hybrid": dict(attention_types=("mamba", "global"), mamba_inner_size=128,
                         rotary_pct=0.25),
}


def small_config(vocab: int = 128, **overrides) -> ModelConfig:
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4,
                intermediate_size=128, seq_length=48, max_position_embeddings=48,
                padded_vocab_size=vocab, seed=7)
    base.update(overrides)
    return ModelConfig(**base)


def random_weights(config: ModelConfig) -> dict[str, torch.Tensor]:
    """Canonical weights of a freshly initialised model (biases made non-zero so that a
    mapping that drops one would show)."""
    module = GPTModel(config)
    g = torch.Generator().manual_seed(config.seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return canonical_from_module(module.state_dict())


def small_model(variant: str = "neox", vocab: int = 128, **overrides
                ) -> tuple[InferenceModel, dict[str, torch.Tensor]]:
    config = small_config(vocab, **{**VARIANTS[variant], **overrides})
    weights = random_weights(config)
    return InferenceModel.from_canonical(config, weights), weights


@functools.lru_cache(maxsize=None)
def trained_checkpoint(root: Path) -> dict:
    """{"data", "tokenizer", "ckpt", "overrides"}: configs/tiny.yml trained 30 iterations on
    the built-in corpus (one process), saved once at the end."""
    from tests.runs import build_small_dataset, deepy, explain, tiny_overrides

    root.mkdir(parents=True, exist_ok=True)
    data, tokenizer = build_small_dataset(root / "data")
    run = root / "run"
    overrides = tiny_overrides(data, tokenizer, run, train_iters=30, num_gpus=1,
                               checkpoint_factor=30, eval_interval=1000, log_interval=10)
    proc = deepy("train.py", "configs/tiny.yml", *overrides)
    assert proc.returncode == 0, explain(proc)
    keep = [o for o in overrides if o.split("=", 1)[0] in
            ("data_path", "vocab_file", "load", "seq_length")]
    return {"data": data, "tokenizer": tokenizer, "ckpt": run / "ckpt", "overrides": keep}


class IdTokenizer:
    """Text is space-separated token ids: a tokenizer that needs no vocabulary file."""

    eod, pad = 0, 0

    def __init__(self, vocab_size: int = 128):
        self.vocab_size, self.max_token_id = vocab_size, vocab_size - 1

    def tokenize(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def detokenize(self, ids) -> str:
        return "".join(f" {i}" for i in ids)
