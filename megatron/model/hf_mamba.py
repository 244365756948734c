"""Our canonical weights and ModelConfig as Hugging Face's Mamba (MambaForCausalLM), and back.

A model of Mamba layers only (attention_config all `mamba`) with RMSNorm without bias and no
position embedding. What corresponds:
- embedding `0.word_embeddings.weight` <-> backbone.embeddings.weight; the final norm
  `<L+1>.norm.weight` <-> backbone.norm_f.weight; an untied head `<L+2>.weight` <-> lm_head
  (tie_word_embeddings otherwise);
- layer i: `<i+1>.norm.weight` <-> backbone.layers.<i>.norm.weight, and the mixer's tensors
  under the same names (in_proj [x; z], conv1d, x_proj, dt_proj, A_log, D, out_proj);
- mamba_inner_size <-> expand * hidden_size (expand must be whole), state 16, convolution
  width 4 and dt_rank ceil(h / 16) as HF's defaults ("auto"); mamba_use_bias_in_conv <->
  use_conv_bias; HF's use_bias puts biases on in_proj and out_proj but not on x_proj, so
  mamba_use_bias_in_linears (GPT-NeoX's, which x_proj has too) is refused;
  rms_norm_epsilon <-> layer_norm_epsilon;
- the residual stream stays in the model's dtype, as ours: residual_in_fp32 false.
GPT-NeoX's Mamba configs keep its default learned position table (pos_emb unset), which HF's
Mamba cannot hold: train with `pos_emb: none` to export.
"""

from __future__ import annotations

import torch

from megatron.model.config import CONV_WIDTH, STATE_SIZE, ModelConfig, dt_rank
from megatron.model.hf_mapping import take

MODEL_TYPE = "mamba"
STATE_SPACE = True  # hf_mapping: no attention layers, no rotary positions
_MIXER = ("in_proj.weight", "conv1d.weight", "conv1d.bias", "x_proj.weight", "dt_proj.weight",
          "dt_proj.bias", "A_log", "D", "out_proj.weight")


def unsupported(config: ModelConfig) -> list[str]:
    """Reasons HF's Mamba cannot hold this model."""
    c, out = config, []
    if set(c.attention_types) != {"mamba"}:
        out.append(f"attention types {sorted(set(c.attention_types))} (Mamba: mamba layers "
                   "only)")
        return out
    if c.pos_emb != "none":
        out.append(f"pos_emb {c.pos_emb!r} (Mamba has no position embedding: train with "
                   "pos_emb none)")
    if c.norm != "rmsnorm" or c.use_bias_in_norms:
        out.append(f"norm {c.norm} with use_bias_in_norms {c.use_bias_in_norms} (Mamba: "
                   "rmsnorm without bias)")
    if c.mamba_inner_size % c.hidden_size:
        out.append(f"mamba channels {c.mamba_inner_size} (Mamba: a whole multiple, expand, of "
                   f"hidden_size {c.hidden_size})")
    if c.mamba_use_bias_in_linears:
        out.append("mamba_use_bias_in_linears true (Mamba's x_proj has no bias)")
    return out


def hf_config(config: ModelConfig, **shared):
    """A `MambaConfig` describing the same model; of `shared` (hf_mapping's keys for every
    architecture) the sizes, tying and token ids apply."""
    from transformers import MambaConfig

    c = config
    return MambaConfig(
        vocab_size=shared["vocab_size"], hidden_size=c.hidden_size, state_size=STATE_SIZE,
        num_hidden_layers=c.num_layers, layer_norm_epsilon=c.norm_epsilon,
        expand=c.mamba_inner_size // c.hidden_size, conv_kernel=CONV_WIDTH,
        time_step_rank=dt_rank(c.hidden_size), use_bias=False,
        use_conv_bias=c.mamba_use_bias_in_conv, hidden_act="silu", residual_in_fp32=False,
        tie_word_embeddings=c.tied_embeddings, bos_token_id=shared.get("bos_token_id"),
        eos_token_id=shared.get("eos_token_id"), pad_token_id=shared.get("eos_token_id"))


def hf_state_dict(canonical: dict[str, torch.Tensor], config: ModelConfig
                  ) -> dict[str, torch.Tensor]:
    c, L = config, config.num_layers
    out = {"backbone.embeddings.weight": canonical["0.word_embeddings.weight"],
           "backbone.norm_f.weight": canonical[f"{L + 1}.norm.weight"]}
    for i in range(L):
        ours, theirs = f"{i + 1}.", f"backbone.layers.{i}."
        out[theirs + "norm.weight"] = canonical[ours + "norm.weight"]
        for name in _mixer_names(c):
            out[theirs + "mixer." + name] = canonical[ours + "mixer." + name]
    out["lm_head.weight"] = (canonical["0.word_embeddings.weight"] if c.tied_embeddings
                             else canonical[f"{L + 2}.weight"])
    return out


def _mixer_names(config: ModelConfig) -> tuple[str, ...]:
    return tuple(n for n in _MIXER if config.mamba_use_bias_in_conv or n != "conv1d.bias")


def import_notes(hf_cfg, config: ModelConfig, precision: str) -> list[str]:
    """residual_in_fp32 (MambaConfig's default): our layers keep the residual stream in the
    run's dtype, as GPT-NeoX's Mamba layers do, the same in fp32 runs."""
    if not getattr(hf_cfg, "residual_in_fp32", False) or precision == "fp32":
        return []
    return [f"residual_in_fp32 true is not carried over: the residual stream is kept in "
            f"{precision}, as in GPT-NeoX's Mamba layers (its sums round to {precision} where "
            "the Hugging Face model sums in fp32; an fp32 run computes the same)"]


def model_config(hf_cfg) -> tuple[ModelConfig, list[str]]:
    """The ModelConfig an HF MambaConfig describes, and what our model does not implement."""
    problems = []
    h = hf_cfg.hidden_size
    if hf_cfg.state_size != STATE_SIZE or hf_cfg.conv_kernel != CONV_WIDTH:
        problems.append(f"state_size {hf_cfg.state_size} and conv_kernel {hf_cfg.conv_kernel} "
                        f"(ours: {STATE_SIZE} and {CONV_WIDTH}, as GPT-NeoX's)")
    if hf_cfg.time_step_rank != dt_rank(h):
        problems.append(f"time_step_rank {hf_cfg.time_step_rank} (ours: ceil(hidden_size / 16) "
                        f"= {dt_rank(h)})")
    if hf_cfg.use_bias:
        problems.append("use_bias true (biases on in_proj and out_proj but not x_proj; our "
                        "mamba_use_bias_in_linears puts one on all three)")
    if hf_cfg.hidden_act != "silu":
        problems.append(f"hidden_act {hf_cfg.hidden_act!r} (silu only)")
    L = hf_cfg.num_hidden_layers
    inner = hf_cfg.intermediate_size
    config = ModelConfig(
        num_layers=L, hidden_size=h, num_attention_heads=1, num_kv_heads=1,
        intermediate_size=inner, seq_length=2048, max_position_embeddings=2048,
        padded_vocab_size=hf_cfg.vocab_size, pos_emb="none", norm="rmsnorm",
        norm_epsilon=hf_cfg.layer_norm_epsilon, activation="silu", use_bias_in_norms=False,
        tied_embeddings=bool(hf_cfg.tie_word_embeddings), attention_types=("mamba",) * L,
        mamba_inner_size=inner, mamba_use_bias_in_conv=bool(hf_cfg.use_conv_bias),
        mamba_use_bias_in_linears=False)
    return config, problems


def canonical_from_hf(state: dict[str, torch.Tensor], config: ModelConfig
                      ) -> dict[str, torch.Tensor]:
    """Our canonical tensors, taken out of the HF `state` (what is left over was not ours)."""
    L = config.num_layers
    embeddings = "backbone.embeddings.weight" if "backbone.embeddings.weight" in state \
        else "backbone.embedding.weight"  # (mamba_ssm's and older files' name)
    out = {"0.word_embeddings.weight": take(state, embeddings),
           f"{L + 1}.norm.weight": take(state, "backbone.norm_f.weight")}
    for i in range(L):
        ours, theirs = f"{i + 1}.", f"backbone.layers.{i}."
        out[ours + "norm.weight"] = take(state, theirs + "norm.weight")
        for name in _mixer_names(config):
            out[ours + "mixer." + name] = take(state, theirs + "mixer." + name)
    head = state.pop("lm_head.weight", None)
    if not config.tied_embeddings:
        if head is None:
            raise ValueError("tensor lm_head.weight is missing from the Hugging Face weights")
        out[f"{L + 2}.weight"] = head
    return out
