"""Our canonical weights and ModelConfig as Hugging Face's Llama (LlamaForCausalLM), and back.

What corresponds:
- attention: our fused QKV rows are laid out per KV group as [q_per_kv query heads, 1 key head,
  1 value head] x head_dim; HF keeps q_proj [heads * d], k_proj and v_proj [kv_heads * d]
  separately, query head j in KV group j // q_per_kv (grouped-query attention as ours);
  attention.dense <-> o_proj; use_bias_in_attn_linear <-> attention_bias (all four);
- MLP: our gated dense_h_to_4h is [value; gate] (activations.py: act(gate) * value), HF's
  down(act(gate_proj(x)) * up_proj(x)): value <-> up_proj, gate <-> gate_proj,
  dense_4h_to_h <-> down_proj; swiglu/geglu/reglu <-> hidden_act silu/gelu/relu;
  use_bias_in_mlp <-> mlp_bias;
- rotary: both rotate-half over the whole head with inv_freq = base^(-2i/d), so rotary_pct
  must be 1.0; rotary_emb_base <-> rope_theta;
- RMSNorm without bias, norm_epsilon <-> rms_norm_eps; sequential residual only;
- tied_embeddings <-> tie_word_embeddings; vocab_size is our padded vocabulary.
"""

from __future__ import annotations

import torch

from megatron.model.config import ModelConfig
from megatron.model.hf_mapping import take

MODEL_TYPE = "llama"
_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}
_NORMS = ("input_layernorm", "post_attention_layernorm")


def unsupported(config: ModelConfig) -> list[str]:
    """Reasons HF's Llama cannot hold this model, besides hf_mapping's checks for every
    architecture (rotary positions, global attention)."""
    c, out = config, []
    if c.pos_emb == "rotary" and int(c.head_dim * c.rotary_pct) != c.head_dim:
        out.append(f"rotary_pct {c.rotary_pct} (Llama rotates whole heads: 1.0)")
    if c.norm != "rmsnorm" or c.use_bias_in_norms:
        out.append(f"norm {c.norm!r} with bias {c.use_bias_in_norms} (Llama: RMSNorm, no bias)")
    if c.activation not in _ACTIVATIONS:
        out.append(f"activation {c.activation!r} (Llama's MLP is gated: "
                   f"{', '.join(_ACTIVATIONS)})")
    if c.gpt_j_residual or c.gpt_j_tied:
        out.append("gpt_j_residual (Llama has a sequential residual)")
    return out


def hf_config(config: ModelConfig, **shared):
    """A `LlamaConfig` describing the same model; `shared`: the keys hf_mapping fills for
    every architecture (sizes, tying, bias, token ids)."""
    from transformers import LlamaConfig

    c = config
    return LlamaConfig(
        num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
        hidden_act=_ACTIVATIONS[c.activation], rms_norm_eps=c.norm_epsilon,
        rope_theta=c.rotary_emb_base, mlp_bias=c.use_bias_in_mlp, **shared)


def _qkv_view(fused: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """[kv * (q_per_kv + 2) * d, ...] -> [kv, q_per_kv + 2, d, ...]."""
    kv, d = config.num_kv_heads, config.head_dim
    return fused.view(kv, config.num_attention_heads // kv + 2, d, *fused.shape[1:])


def _split_qkv(fused: torch.Tensor, config: ModelConfig) -> tuple[torch.Tensor, ...]:
    """Our fused QKV weight or bias -> HF's (q_proj, k_proj, v_proj) of the same kind."""
    groups = _qkv_view(fused, config)  # [kv, q_per_kv + 2, d, ...]
    rest = fused.shape[1:]
    q = groups[:, :-2].reshape(-1, *rest)  # [heads * d, ...]
    return q, groups[:, -2].reshape(-1, *rest), groups[:, -1].reshape(-1, *rest)


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: ModelConfig
              ) -> torch.Tensor:
    """Inverse of `_split_qkv`."""
    kv, d, rest = config.num_kv_heads, config.head_dim, q.shape[1:]
    groups = torch.cat([q.reshape(kv, -1, d, *rest), k.reshape(kv, 1, d, *rest),
                        v.reshape(kv, 1, d, *rest)], dim=1)  # [kv, q_per_kv + 2, d, ...]
    return groups.reshape(-1, *rest)


def attention_to_hf(ours: dict[str, torch.Tensor], config: ModelConfig
                    ) -> dict[str, torch.Tensor]:
    """A layer's norms and attention: our tensors (by path inside the layer) -> HF's (by name
    inside `model.layers.<i>.`); the MLP apart."""
    get = ours.__getitem__
    out = {f"{n}.weight": get(f"{n}.weight") for n in _NORMS}
    kinds = ("weight", "bias") if config.use_bias_in_attn_linear else ("weight",)
    for kind in kinds:
        q, k, v = _split_qkv(get(f"attention.query_key_value.{kind}"), config)
        out.update({f"self_attn.q_proj.{kind}": q, f"self_attn.k_proj.{kind}": k,
                    f"self_attn.v_proj.{kind}": v,
                    f"self_attn.o_proj.{kind}": get(f"attention.dense.{kind}")})
    return out


def _layer_to_hf(ours: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """One transformer layer: our tensors (by path inside the layer) -> HF's (by name inside
    `model.layers.<i>.`)."""
    get = ours.__getitem__
    out = attention_to_hf(ours, config)
    for kind in ("weight", "bias") if config.use_bias_in_mlp else ("weight",):
        value, gate = get(f"mlp.dense_h_to_4h.{kind}").chunk(2, dim=0)
        out.update({f"mlp.up_proj.{kind}": value, f"mlp.gate_proj.{kind}": gate,
                    f"mlp.down_proj.{kind}": get(f"mlp.dense_4h_to_h.{kind}")})
    return out


def hf_state_dict(canonical: dict[str, torch.Tensor], config: ModelConfig,
                  layer_to_hf=_layer_to_hf) -> dict[str, torch.Tensor]:
    """HF LlamaForCausalLM tensor names -> tensors (each layer's by `layer_to_hf`)."""
    L = config.num_layers
    out = {"model.embed_tokens.weight": canonical["0.word_embeddings.weight"]}
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in canonical.items():
        index, path = name.split(".", 1)
        layers.setdefault(int(index), {})[path] = tensor
    for i in range(L):
        for name, tensor in layer_to_hf(layers[i + 1], config).items():
            out[f"model.layers.{i}.{name}"] = tensor.contiguous()
    out["model.norm.weight"] = canonical[f"{L + 1}.norm.weight"]
    out["lm_head.weight"] = (out["model.embed_tokens.weight"] if config.tied_embeddings
                             else canonical[f"{L + 2}.weight"])
    return out


def model_fields(hf_cfg) -> tuple[dict, list[str]]:
    """ModelConfig fields of a `LlamaConfig` beyond hf_mapping's shared ones, and what of it
    our model cannot run."""
    act = {v: k for k, v in _ACTIVATIONS.items()}.get(hf_cfg.hidden_act)
    problems = [] if act else [f"hidden_act {hf_cfg.hidden_act!r} (supported: "
                               f"{', '.join(_ACTIVATIONS.values())})"]
    heads, hidden = hf_cfg.num_attention_heads, hf_cfg.hidden_size
    head_dim = getattr(hf_cfg, "head_dim", None) or hidden // heads
    if head_dim * heads != hidden:
        problems.append(f"head_dim {head_dim} * num_attention_heads {heads} != hidden_size "
                        f"{hidden} (our heads split the hidden size)")
    return dict(num_kv_heads=hf_cfg.num_key_value_heads or heads, rotary_pct=1.0,
                norm="rmsnorm", norm_epsilon=hf_cfg.rms_norm_eps,
                activation=act or hf_cfg.hidden_act, use_bias_in_norms=False,
                use_bias_in_attn_linear=bool(getattr(hf_cfg, "attention_bias", False)),
                use_bias_in_mlp=bool(getattr(hf_cfg, "mlp_bias", False))), problems


def attention_from_hf(state: dict, prefix: str, config: ModelConfig
                      ) -> dict[str, torch.Tensor]:
    """A layer's norms and attention (paths inside a layer) from HF's tensors under `prefix`;
    removed from `state`."""
    out = {f"{n}.weight": take(state, f"{prefix}{n}.weight") for n in _NORMS}
    kinds = ("weight", "bias") if config.use_bias_in_attn_linear else ("weight",)
    for kind in kinds:
        q, k, v = (take(state, f"{prefix}self_attn.{p}_proj.{kind}") for p in "qkv")
        out[f"attention.query_key_value.{kind}"] = _fuse_qkv(q, k, v, config)
        out[f"attention.dense.{kind}"] = take(state, f"{prefix}self_attn.o_proj.{kind}")
    return out


def _layer_from_hf(state: dict, prefix: str, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our tensors (paths inside a layer) from HF's under `prefix`; removed from `state`."""
    out = attention_from_hf(state, prefix, config)
    for kind in ("weight", "bias") if config.use_bias_in_mlp else ("weight",):
        up, gate = (take(state, f"{prefix}mlp.{p}_proj.{kind}") for p in ("up", "gate"))
        out[f"mlp.dense_h_to_4h.{kind}"] = torch.cat([up, gate], dim=0)
        out[f"mlp.dense_4h_to_h.{kind}"] = take(state, f"{prefix}mlp.down_proj.{kind}")
    return out


def canonical_from_hf(state: dict[str, torch.Tensor], config: ModelConfig,
                      layer_from_hf=_layer_from_hf) -> dict[str, torch.Tensor]:
    """Canonical weights from HF LlamaForCausalLM tensors (each layer's by `layer_from_hf`);
    the tensors used are removed from `state` (what is left over was not expected)."""
    L = config.num_layers
    out = {"0.word_embeddings.weight": take(state, "model.embed_tokens.weight")}
    for i in range(L):
        layer = layer_from_hf(state, f"model.layers.{i}.", config)
        out.update({f"{i + 1}.{path}": t for path, t in layer.items()})
        state.pop(f"model.layers.{i}.self_attn.rotary_emb.inv_freq", None)  # old .bin files
    out[f"{L + 1}.norm.weight"] = take(state, "model.norm.weight")
    if not config.tied_embeddings:
        out[f"{L + 2}.weight"] = take(state, "lm_head.weight")
    else:
        state.pop("lm_head.weight", None)  # some files store the tied head as well
    return out
