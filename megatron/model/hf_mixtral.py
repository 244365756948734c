"""Our canonical weights and ModelConfig as Hugging Face's Mixtral (MixtralForCausalLM), and back.

Mixtral is Llama's attention, norms and rotary (hf_llama.py: no biases) with a mixture of
experts in place of every MLP. What corresponds, beyond Llama's:
- MoE in every layer: moe_expert_interval 1; moe_num_experts <-> num_local_experts,
  moe_top_k <-> num_experts_per_tok;
- routing: the top k of the router's softmax, the k weights rescaled to sum to 1, in training
  too: moe_router_type topk with moe_normalize_topk; moe_aux_loss_coeff <->
  router_aux_loss_coef (Mixtral's balance loss is the same Switch loss, megatron/model/moe.py);
  HF's output_router_logits stays false, as in Mixtral's own configs. router_jitter_noise does
  not correspond to moe_jitter_eps: Mixtral scales the hidden states both the router and the
  experts read, GPT-NeoX (and this project) the router's input only. Neither is carried over:
  an import says so where the model's config.json has jitter, and an export of a model
  trained with moe_jitter_eps writes router_jitter_noise 0 and says so. Both touch training
  only; inference computes the same;
- router: mlp.router.weight [E, h] <-> the gate's weight;
- experts: our mlp.experts.w_in [E, 2f, h] holds [value; gate] rows per expert, w_out
  [E, h, f]. Mixtral's files (and transformers before 5) keep each expert apart, under
  block_sparse_moe: experts.<e>.w1 the gate [f, h], w3 the value ("up"), w2 the output
  [h, f]; transformers 5 holds them in memory as mlp.experts.gate_up_proj [E, 2f, h] as
  [gate; up] and mlp.experts.down_proj [E, h, f], converting on load and save. Import reads
  either; export gives the installed transformers' in-memory names. swiglu <-> silu.
"""

from __future__ import annotations

import torch

from megatron.model import hf_llama
from megatron.model.config import ModelConfig
from megatron.model.hf_mapping import take

MODEL_TYPE = "mixtral"
MIXTURE_OF_EXPERTS = True  # hf_mapping: this architecture holds MoE layers
_ACTIVATIONS = hf_llama._ACTIVATIONS  # the experts are Llama's gated MLPs


def unsupported(config: ModelConfig) -> list[str]:
    """Reasons HF's Mixtral cannot hold this model, besides hf_mapping's checks for every
    architecture (rotary positions, global attention)."""
    c = config
    out = hf_llama.unsupported(c)
    if c.use_bias_in_attn_linear:
        out.append("use_bias_in_attn_linear true (Mixtral's attention has no biases)")
    if c.moe_num_experts < 2 or c.moe_expert_interval != 1:
        out.append(f"moe_num_experts {c.moe_num_experts} with moe_expert_interval "
                   f"{c.moe_expert_interval} (Mixtral has experts in every layer)")
    if c.moe_router_type != "topk" or not c.moe_normalize_topk:
        out.append(f"moe_router_type {c.moe_router_type} with moe_normalize_topk "
                   f"{c.moe_normalize_topk} (Mixtral routes to the normalised top k: topk, true)")
    return out


def hf_config(config: ModelConfig, **shared):
    """A `MixtralConfig` describing the same model; `shared`: the keys hf_mapping fills for
    every architecture (sizes, tying, token ids)."""
    from transformers import MixtralConfig

    c = config
    shared.pop("attention_bias", None)  # not a Mixtral setting: never true here
    return MixtralConfig(
        num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
        hidden_act=_ACTIVATIONS[c.activation], rms_norm_eps=c.norm_epsilon,
        rope_theta=c.rotary_emb_base, num_local_experts=c.moe_num_experts,
        num_experts_per_tok=c.moe_top_k, router_jitter_noise=0.0,  # not ours: export_notes
        router_aux_loss_coef=c.moe_aux_loss_coeff, sliding_window=None, **shared)


def fused_experts() -> bool:
    """Whether the installed transformers holds a layer's experts as 3-D tensors (5.x)."""
    from transformers.models.mixtral import modeling_mixtral

    return hasattr(modeling_mixtral, "MixtralExperts")


def _layer_to_hf(ours: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    out = hf_llama.attention_to_hf(ours, config)
    value, gate = ours["mlp.experts.w_in"].chunk(2, dim=1)  # [E, f, h] each
    down = ours["mlp.experts.w_out"]  # [E, h, f]
    if fused_experts():
        out.update({"mlp.gate.weight": ours["mlp.router.weight"],
                    "mlp.experts.gate_up_proj": torch.cat([gate, value], dim=1),
                    "mlp.experts.down_proj": down})
        return out
    out["block_sparse_moe.gate.weight"] = ours["mlp.router.weight"]
    for e in range(config.moe_num_experts):
        name = f"block_sparse_moe.experts.{e}"
        out.update({f"{name}.w1.weight": gate[e], f"{name}.w3.weight": value[e],
                    f"{name}.w2.weight": down[e]})
    return out


def hf_state_dict(canonical: dict[str, torch.Tensor], config: ModelConfig
                  ) -> dict[str, torch.Tensor]:
    """HF MixtralForCausalLM tensor names -> tensors."""
    return hf_llama.hf_state_dict(canonical, config, _layer_to_hf)


def model_fields(hf_cfg) -> tuple[dict, list[str]]:
    """ModelConfig fields of a `MixtralConfig` beyond hf_mapping's shared ones, and what of it
    our model cannot run."""
    fields, problems = hf_llama.model_fields(hf_cfg)  # Mixtral has no attention_bias: false
    if getattr(hf_cfg, "sliding_window", None):
        problems.append(f"sliding_window {hf_cfg.sliding_window} (Mixtral's window is not "
                        "mapped; set it to null for full attention)")
    return dict(fields, use_bias_in_mlp=False, moe_num_experts=hf_cfg.num_local_experts,
                moe_top_k=hf_cfg.num_experts_per_tok, moe_router_type="topk",
                moe_normalize_topk=True,
                moe_aux_loss_coeff=float(hf_cfg.router_aux_loss_coef)), problems


def import_notes(hf_cfg, config: ModelConfig, precision: str) -> list[str]:
    """The training settings of a MixtralConfig an import into `config` does not take."""
    notes = []
    jitter = float(getattr(hf_cfg, "router_jitter_noise", 0.0) or 0.0)
    if jitter:
        notes.append(f"router_jitter_noise {jitter} is not carried over: Mixtral scales what the "
                     "router and the experts read, moe_jitter_eps (GPT-NeoX's) the router's "
                     f"input only; training takes the config's moe_jitter_eps "
                     f"({config.moe_jitter_eps})")
    coef = float(hf_cfg.router_aux_loss_coef)
    if coef != config.moe_aux_loss_coeff:
        notes.append(f"router_aux_loss_coef {coef} is not the config's moe_aux_loss_coeff "
                     f"{config.moe_aux_loss_coeff}, which training takes")
    return notes


def export_notes(config: ModelConfig) -> list[str]:
    """What of `config` a MixtralConfig does not hold."""
    if not config.moe_jitter_eps:
        return []
    return [f"moe_jitter_eps {config.moe_jitter_eps} is not exported: Mixtral's "
            "router_jitter_noise also scales what the experts read, so the Hugging Face config "
            "has router_jitter_noise 0 (training only; inference is the same)"]


def _layer_from_hf(state: dict, prefix: str, config: ModelConfig) -> dict[str, torch.Tensor]:
    out = hf_llama.attention_from_hf(state, prefix, config)
    apart = f"{prefix}block_sparse_moe."
    if f"{apart}gate.weight" in state:  # Mixtral's files: one tensor per expert and matrix
        out["mlp.router.weight"] = take(state, f"{apart}gate.weight")
        experts = [f"{apart}experts.{e}." for e in range(config.moe_num_experts)]
        gate, up, down = (torch.stack([take(state, f"{e}{w}.weight") for e in experts])
                          for w in ("w1", "w3", "w2"))
    else:  # transformers 5 in memory
        out["mlp.router.weight"] = take(state, f"{prefix}mlp.gate.weight")
        gate, up = take(state, f"{prefix}mlp.experts.gate_up_proj").chunk(2, dim=1)
        down = take(state, f"{prefix}mlp.experts.down_proj")
    out["mlp.experts.w_in"] = torch.cat([up, gate], dim=1)  # [E, 2f, h]: value, then gate
    out["mlp.experts.w_out"] = down
    return out


def canonical_from_hf(state: dict[str, torch.Tensor], config: ModelConfig
                      ) -> dict[str, torch.Tensor]:
    """Canonical weights from HF MixtralForCausalLM tensors; the tensors used are removed
    from `state`."""
    return hf_llama.canonical_from_hf(state, config, _layer_from_hf)
