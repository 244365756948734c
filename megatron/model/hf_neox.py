"""Our canonical weights and ModelConfig as Hugging Face's GPTNeoX (GPTNeoXForCausalLM), and back.

The mapping is name for name; only architectures HF's GPTNeoX can express are accepted:
- attention: our QKV rows are laid out per KV group as [q_per_kv queries, 1 key, 1 value] x
  head_dim, which with num_kv_heads == num_attention_heads is HF's [heads, 3, head_dim];
- rotary: both rotate-half on the first int(head_dim * rotary_pct) channels of each head
  (HF: rope_parameters.partial_rotary_factor, rope_theta = our rotary_emb_base);
- gpt_j_residual <-> use_parallel_residual (gpt_j_tied has no HF equivalent);
- layernorm with biases, a plain (non-gated) activation, biases in the MLP;
- tied_embeddings <-> tie_word_embeddings; vocab_size is our padded vocabulary;
- gelu with bias_gelu_fusion (GELU's tanh approximation) <-> hidden_act gelu_pytorch_tanh
  (gelu_new and gelu_fast, the same function, import the same way).
Anything else is refused with the list of what differs. Dispatch goes through hf_mapping.
"""

from __future__ import annotations

import torch

from megatron.model.config import ModelConfig
from megatron.model.hf_mapping import rope_of, take

MODEL_TYPE = "gpt_neox"
_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "silu": "silu"}
_TANH_GELU = "gelu_pytorch_tanh"
_TANH_GELUS = (_TANH_GELU, "gelu_new", "gelu_fast")
_PREFIX = "gpt_neox"
_HEADS = ("lm_head.weight", "embed_out.weight")  # transformers >= 5.0, < 5.0
_BUFFERS = ("attention.bias", "attention.masked_bias", "rotary_emb.inv_freq")  # old .bin files


def unsupported(config: ModelConfig) -> list[str]:
    """Reasons HF's GPTNeoX cannot hold this model, besides hf_mapping's checks for every
    architecture (rotary positions, global attention)."""
    c, out = config, []
    if c.num_kv_heads != c.num_attention_heads:
        out.append(f"num_kv_heads {c.num_kv_heads} != num_attention_heads "
                   f"{c.num_attention_heads} (GPTNeoX has no grouped-query attention)")
    if c.norm != "layernorm" or not c.use_bias_in_norms:
        out.append(f"norm {c.norm!r} with bias {c.use_bias_in_norms} (GPTNeoX: LayerNorm, bias)")
    if c.activation not in _ACTIVATIONS:
        out.append(f"activation {c.activation!r} (supported: {', '.join(_ACTIVATIONS)})")
    if not c.use_bias_in_mlp:
        out.append("use_bias_in_mlp false (GPTNeoX's MLP has biases)")
    if c.gpt_j_tied:
        out.append("gpt_j_tied (GPTNeoX has a separate post-attention norm)")
    return out


def hf_config(config: ModelConfig, **shared):
    """A `GPTNeoXConfig` describing the same model; `shared`: the keys hf_mapping fills for
    every architecture (sizes, tying, bias, token ids)."""
    from transformers import GPTNeoXConfig

    c = config
    return GPTNeoXConfig(
        hidden_act=_TANH_GELU if c.activation == "gelu" and c.bias_gelu_fusion
        else _ACTIVATIONS[c.activation], rotary_pct=c.rotary_pct,
        rotary_emb_base=c.rotary_emb_base, layer_norm_eps=c.norm_epsilon,
        use_parallel_residual=c.gpt_j_residual, hidden_dropout=0.0, **shared)


def hf_state_dict(canonical: dict[str, torch.Tensor], config: ModelConfig
                  ) -> dict[str, torch.Tensor]:
    """HF GPTNeoXForCausalLM tensor names -> tensors (the LM head as `lm_head.weight`)."""
    L = config.num_layers
    out = {f"{_PREFIX}.embed_in.weight": canonical["0.word_embeddings.weight"]}
    for name, tensor in canonical.items():
        layer, path = name.split(".", 1)
        if 1 <= int(layer) <= L:
            out[f"{_PREFIX}.layers.{int(layer) - 1}.{path}"] = tensor
    for kind in ("weight", "bias"):
        out[f"{_PREFIX}.final_layer_norm.{kind}"] = canonical[f"{L + 1}.norm.{kind}"]
    out["lm_head.weight"] = (out[f"{_PREFIX}.embed_in.weight"] if config.tied_embeddings
                             else canonical[f"{L + 2}.weight"])
    return out


def model_fields(hf_cfg) -> tuple[dict, list[str]]:
    """ModelConfig fields of a `GPTNeoXConfig` beyond hf_mapping's shared ones, and what of it
    our model cannot run."""
    _, partial, _ = rope_of(hf_cfg)
    tanh_gelu = hf_cfg.hidden_act in _TANH_GELUS
    act = "gelu" if tanh_gelu else {v: k for k, v in _ACTIVATIONS.items()}.get(hf_cfg.hidden_act)
    problems = [] if act else [f"hidden_act {hf_cfg.hidden_act!r} (supported: "
                               f"{', '.join((*_ACTIVATIONS.values(), *_TANH_GELUS))})"]
    return dict(num_kv_heads=hf_cfg.num_attention_heads, rotary_pct=partial, norm="layernorm",
                norm_epsilon=hf_cfg.layer_norm_eps, activation=act or hf_cfg.hidden_act,
                bias_gelu_fusion=tanh_gelu,
                gpt_j_residual=bool(hf_cfg.use_parallel_residual),
                use_bias_in_attn_linear=bool(getattr(hf_cfg, "attention_bias", True))), problems


def canonical_from_hf(state: dict[str, torch.Tensor], config: ModelConfig
                      ) -> dict[str, torch.Tensor]:
    """Canonical weights from HF GPTNeoXForCausalLM tensors; the tensors used are removed from
    `state` (what is left over was not expected)."""
    L = config.num_layers
    out = {"0.word_embeddings.weight": take(state, f"{_PREFIX}.embed_in.weight")}
    for i in range(L):
        prefix = f"{_PREFIX}.layers.{i}."
        for name in [n for n in state if n.startswith(prefix)]:
            path = name[len(prefix):]
            tensor = state.pop(name)
            if not path.endswith(_BUFFERS):
                out[f"{i + 1}.{path}"] = tensor
    for kind in ("weight", "bias"):
        out[f"{L + 1}.norm.{kind}"] = take(state, f"{_PREFIX}.final_layer_norm.{kind}")
    head = next((h for h in _HEADS if h in state), _HEADS[0])
    if not config.tied_embeddings:
        out[f"{L + 2}.weight"] = take(state, head)
    else:
        state.pop(head, None)  # some files store the tied head as well
    return out
