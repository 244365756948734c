"""Our canonical weights + ModelConfig as Hugging Face's GPTNeoX (config and state dict).

    model = to_hf_model(canonical, config)            # a GPTNeoXForCausalLM in eval mode
    hf_cfg = hf_config(config); sd = hf_state_dict(canonical, config, head="lm_head.weight")

The mapping is name for name; only architectures HF's GPTNeoX can express are accepted:
- attention: our QKV rows are laid out per KV group as [q_per_kv queries, 1 key, 1 value] x
  head_dim, which with num_kv_heads == num_attention_heads is HF's [heads, 3, head_dim];
- rotary: both rotate-half on the first int(head_dim * rotary_pct) channels of each head;
- gpt_j_residual <-> use_parallel_residual (gpt_j_tied has no HF equivalent);
- layernorm with biases, a plain (non-gated) activation, biases in the MLP;
- tied_embeddings <-> tie_word_embeddings; vocab_size is our padded vocabulary.
Anything else is refused with the list of what differs. Needs `transformers`
(requirements/requirements-hf.txt).
"""

from __future__ import annotations

import torch

from megatron.model.config import ModelConfig

_HF_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "silu": "silu"}


def unsupported(config: ModelConfig) -> list[str]:
    """Reasons HF's GPTNeoX cannot hold this model (empty when it can)."""
    c, out = config, []
    if c.pos_emb != "rotary":
        out.append(f"pos_emb {c.pos_emb!r} (GPTNeoX has rotary only)")
    if c.num_kv_heads != c.num_attention_heads:
        out.append(f"num_kv_heads {c.num_kv_heads} != num_attention_heads "
                   f"{c.num_attention_heads} (GPTNeoX has no grouped-query attention)")
    if c.norm != "layernorm" or not c.use_bias_in_norms:
        out.append(f"norm {c.norm!r} with bias {c.use_bias_in_norms} (GPTNeoX: LayerNorm, bias)")
    if c.activation not in _HF_ACTIVATIONS:
        out.append(f"activation {c.activation!r} (supported: {', '.join(_HF_ACTIVATIONS)})")
    if not c.use_bias_in_mlp:
        out.append("use_bias_in_mlp false (GPTNeoX's MLP has biases)")
    if c.gpt_j_tied:
        out.append("gpt_j_tied (GPTNeoX has a separate post-attention norm)")
    if any(t != "global" for t in c.attention_types):
        out.append(f"attention types {sorted(set(c.attention_types))} (GPTNeoX: global only)")
    return out


def hf_config(config: ModelConfig, eos_token_id: int | None = None, **extra):
    """A `GPTNeoXConfig` describing the same model as `config`."""
    from transformers import GPTNeoXConfig

    problems = unsupported(config)
    if problems:
        raise ValueError("this model cannot be expressed as Hugging Face GPTNeoX: "
                         + "; ".join(problems))
    c = config
    return GPTNeoXConfig(
        vocab_size=c.padded_vocab_size, hidden_size=c.hidden_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size, hidden_act=_HF_ACTIVATIONS[c.activation],
        rotary_pct=c.rotary_pct, rotary_emb_base=c.rotary_emb_base,
        max_position_embeddings=c.max_position_embeddings, layer_norm_eps=c.norm_epsilon,
        use_parallel_residual=c.gpt_j_residual, tie_word_embeddings=c.tied_embeddings,
        attention_bias=c.use_bias_in_attn_linear, attention_dropout=0.0, hidden_dropout=0.0,
        bos_token_id=eos_token_id, eos_token_id=eos_token_id, **extra)


def hf_state_dict(canonical: dict[str, torch.Tensor], config: ModelConfig,
                  head: str = "lm_head.weight") -> dict[str, torch.Tensor]:
    """HF GPTNeoXForCausalLM tensor names -> tensors; `head` is the LM head's name in the
    installed transformers (`embed_out.weight` before 5.0, `lm_head.weight` since)."""
    L = config.num_layers
    out = {"gpt_neox.embed_in.weight": canonical["0.word_embeddings.weight"]}
    for i in range(L):
        for name, tensor in canonical.items():
            layer, path = name.split(".", 1)
            if int(layer) == i + 1:
                out[f"gpt_neox.layers.{i}.{path}"] = tensor
    out["gpt_neox.final_layer_norm.weight"] = canonical[f"{L + 1}.norm.weight"]
    out["gpt_neox.final_layer_norm.bias"] = canonical[f"{L + 1}.norm.bias"]
    out[head] = canonical[f"{L + 2}.weight"] if not config.tied_embeddings else out[
        "gpt_neox.embed_in.weight"]
    return out


def to_hf_model(canonical: dict[str, torch.Tensor], config: ModelConfig,
                eos_token_id: int | None = None, attn_implementation: str = "sdpa"):
    """A `GPTNeoXForCausalLM` in eval mode holding the same weights (fp32 copies)."""
    from transformers import GPTNeoXForCausalLM

    hf_cfg = hf_config(config, eos_token_id)
    hf_cfg._attn_implementation = attn_implementation
    model = GPTNeoXForCausalLM(hf_cfg)
    head = next(n for n, m in model.named_modules() if m is model.get_output_embeddings())
    state = hf_state_dict({k: v.float() for k, v in canonical.items()}, config, f"{head}.weight")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith(("attention.bias", "attention.masked_bias",
                                                     "rotary_emb.inv_freq"))]
    if missing or unexpected:
        raise ValueError(f"Hugging Face GPTNeoX state does not match: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.eval()
