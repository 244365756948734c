"""Our canonical weights + ModelConfig as a Hugging Face causal LM and back: the registry of the
architectures HF can hold (GPTNeoX, Llama, Mixtral, Mamba) and the dispatch between them.

    name = architecture_for(config)                      # "neox" or "llama" (ValueError: why not)
    model = to_hf_model(canonical, config)               # GPTNeoXForCausalLM / LlamaForCausalLM
    hf_cfg = hf_config(config); sd = hf_state_dict(canonical, config)
    canonical, config = canonical_from_hf(state_dict, hf_cfg)           # the inverse
    name, config = hf_model_config(hf_cfg)                              # config only

One module per architecture (hf_neox.py, hf_llama.py, hf_mixtral.py, hf_mamba.py) says what
corresponds to what and lists what its HF class cannot express. HF's vocab_size is our padded
vocabulary (the rows the model embeds), so the logits match column for column. Needs
`transformers` (requirements/requirements-hf.txt).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib

import torch

from megatron.model.config import ModelConfig

ARCHITECTURES = {"neox": "megatron.model.hf_neox", "llama": "megatron.model.hf_llama",
                 "mixtral": "megatron.model.hf_mixtral", "mamba": "megatron.model.hf_mamba"}
HF_CLASSES = {"neox": "GPTNeoXForCausalLM", "llama": "LlamaForCausalLM",
              "mixtral": "MixtralForCausalLM", "mamba": "MambaForCausalLM"}
# a reward model (ModelConfig.value_head): the same body with a one-label `score` head
HF_REWARD_CLASSES = {"neox": "GPTNeoXForSequenceClassification",
                     "llama": "LlamaForSequenceClassification",
                     "mixtral": "MixtralForSequenceClassification"}
_TITLES = {"neox": "GPTNeoX", "llama": "Llama", "mixtral": "Mixtral", "mamba": "Mamba"}


def mapping_module(name: str):
    """The mapping module registered as `name`; an unknown name lists the valid ones."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown Hugging Face architecture {name!r}; valid: auto, "
                         f"{', '.join(ARCHITECTURES)}")
    return importlib.import_module(ARCHITECTURES[name])


def unsupported(config: ModelConfig, name: str = "neox") -> list[str]:
    """Reasons the HF architecture `name` cannot hold this model (empty when it can)."""
    module, title, out = mapping_module(name), _TITLES.get(name, name), []
    if config.value_head and name not in HF_REWARD_CLASSES:
        out.append(f"a value head (reward model): {title} has no sequence classifier mapped")
    if config.moe_num_experts > 1 and not getattr(module, "MIXTURE_OF_EXPERTS", False):
        out.append(f"moe_num_experts {config.moe_num_experts} ({title} has dense MLPs only)")
    if getattr(module, "STATE_SPACE", False):  # no attention: the module says what it holds
        return out + module.unsupported(config)
    if config.pos_emb != "rotary":
        out.append(f"pos_emb {config.pos_emb!r} ({title} has rotary only)")
    windowed = sorted({t for t, seen in zip(config.attention_types, config.layer_attention)
                       if seen is not None})  # `flash` without a window computes `global`'s
    if windowed:
        out.append(f"attention types {windowed} ({title}: global only, or flash without a "
                   "window)")
    return out + module.unsupported(config)


def architecture_for(config: ModelConfig, name: str = "auto") -> str:
    """`name` if it holds the model, or with "auto" the first architecture that does;
    ValueError naming what each candidate cannot express."""
    candidates = list(ARCHITECTURES) if name == "auto" else [name]
    reasons = {}
    for candidate in candidates:
        reasons[candidate] = unsupported(config, candidate)
        if not reasons[candidate]:
            return candidate
    if name != "auto":
        raise ValueError(f"this model cannot be expressed as Hugging Face {_TITLES[name]}: "
                         + "; ".join(reasons[name]))
    raise ValueError("this model cannot be expressed as any Hugging Face architecture we map: "
                     + " | ".join(f"{_TITLES[n]}: " + "; ".join(r) for n, r in reasons.items()))


def hf_config(config: ModelConfig, eos_token_id: int | None = None, architecture: str = "auto",
              **extra):
    """The HF config (GPTNeoXConfig / LlamaConfig) describing the same model; bos and eos are
    `eos_token_id` (GPT-NeoX's end-of-document token), `extra` goes to the config."""
    name = architecture_for(config, architecture)
    c = config
    shared = dict(vocab_size=c.padded_vocab_size, hidden_size=c.hidden_size,
                  num_hidden_layers=c.num_layers, num_attention_heads=c.num_attention_heads,
                  intermediate_size=c.intermediate_size,
                  max_position_embeddings=c.max_position_embeddings,
                  tie_word_embeddings=c.tied_embeddings, attention_bias=c.use_bias_in_attn_linear,
                  attention_dropout=0.0, bos_token_id=eos_token_id, eos_token_id=eos_token_id)
    return mapping_module(name).hf_config(config, **{**shared, **extra})


def hf_state_dict(canonical: dict[str, torch.Tensor], config: ModelConfig,
                  architecture: str = "auto", head: str = "lm_head.weight"
                  ) -> dict[str, torch.Tensor]:
    """HF tensor names -> tensors; `head` is the LM head's name in the installed transformers
    (GPTNeoX's was `embed_out.weight` before 5.0)."""
    name = architecture_for(config, architecture)
    out = mapping_module(name).hf_state_dict(canonical, config)
    out[head] = out.pop("lm_head.weight")
    return out


@contextlib.contextmanager
def _no_random_init():
    """Skip HF's random initialisation of weights that are overwritten right after."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers < 5
        from transformers.modeling_utils import no_init_weights
    with no_init_weights():
        yield


def hf_class_name(config: ModelConfig, name: str) -> str:
    """The HF class of the model: a causal LM, or for a reward model a sequence classifier."""
    return (HF_REWARD_CLASSES if config.value_head else HF_CLASSES)[name]


def to_hf_model(canonical: dict[str, torch.Tensor], config: ModelConfig,
                eos_token_id: int | None = None, attn_implementation: str = "sdpa",
                architecture: str = "auto", dtype: torch.dtype = torch.float32, **extra):
    """The HF causal LM (in eval mode, `dtype`) holding the same weights; for a reward model
    (`config.value_head`) the sequence classifier of one label whose `score` is the value head
    (HF reads it at the last token that is not padding, so `pad_token_id` must be given)."""
    import transformers

    name = architecture_for(config, architecture)
    if config.value_head:
        extra = {**extra, "num_labels": 1}
    hf_cfg = hf_config(config, eos_token_id, name, **extra)
    if getattr(mapping_module(name), "STATE_SPACE", False):
        attn_implementation = "eager"  # no attention to implement
    hf_cfg._attn_implementation = attn_implementation
    with _no_random_init():
        model = getattr(transformers, hf_class_name(config, name))(hf_cfg)
    if config.value_head:
        state = _reward_state_dict(canonical, config, name)
    else:
        head = next(n for n, m in model.named_modules() if m is model.get_output_embeddings())
        state = hf_state_dict(canonical, config, name, f"{head}.weight")
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()},
                                                strict=False)
    missing = [m for m in missing if not m.endswith(("attention.bias", "attention.masked_bias",
                                                     "rotary_emb.inv_freq"))]
    if missing or unexpected:
        raise ValueError(f"Hugging Face {hf_class_name(config, name)} state does not match: "
                         f"missing {missing}, unexpected {unexpected}")
    return model.to(dtype).eval()


def _reward_state_dict(canonical: dict[str, torch.Tensor], config: ModelConfig, name: str
                       ) -> dict[str, torch.Tensor]:
    """HF names -> tensors of a reward model: the body as for a causal LM, the value head as
    `score.weight` [1, h]."""
    value = f"{config.num_layers + 2}.value.weight"
    body = dataclasses.replace(config, tied_embeddings=True, value_head=False)  # no LM head
    state = mapping_module(name).hf_state_dict(
        {k: v for k, v in canonical.items() if k != value}, body)
    state.pop("lm_head.weight")
    state["score.weight"] = canonical[value]
    return state


def import_notes(hf_cfg, config: ModelConfig, precision: str) -> list[str]:
    """What of the HF config `hf_cfg` an import into a checkpoint of `config` (the run config,
    of `precision`) does not carry over, one sentence each (training settings the checkpoint
    takes from the run config; sums the model keeps in another dtype)."""
    module = mapping_module(hf_model_config(hf_cfg)[0])
    return module.import_notes(hf_cfg, config, precision) if hasattr(module, "import_notes") \
        else []


def export_notes(config: ModelConfig, architecture: str) -> list[str]:
    """What of `config` the HF `architecture` does not hold, one sentence each."""
    module = mapping_module(architecture)
    return module.export_notes(config) if hasattr(module, "export_notes") else []


def hf_model_config(hf_cfg) -> tuple[str, ModelConfig]:
    """(our architecture name, the ModelConfig) an HF config of an ARCHITECTURES kind describes;
    padded_vocab_size is HF's vocab_size. ValueError for another model type or a feature our
    model does not implement (rope scaling, another activation, ...)."""
    model_type = getattr(hf_cfg, "model_type", None)
    by_type = {mapping_module(n).MODEL_TYPE: n for n in ARCHITECTURES}
    if model_type not in by_type:
        raise ValueError(f"Hugging Face model_type {model_type!r} cannot be converted; supported: "
                         f"{', '.join(f'{t} ({HF_CLASSES[n]})' for t, n in by_type.items())}")
    module = mapping_module(by_type[model_type])
    if hasattr(module, "model_config"):  # a whole config of its own (no attention)
        config, problems = module.model_config(hf_cfg)
        if problems:
            raise ValueError(f"the Hugging Face {model_type} model uses what our model does "
                             "not implement: " + "; ".join(problems))
        return by_type[model_type], config
    theta, _, rope_type = rope_of(hf_cfg)
    own, problems = module.model_fields(hf_cfg)
    if rope_type != "default":
        problems.insert(0, f"rope_type {rope_type!r} (only 'default' rotary is supported)")
    if problems:
        raise ValueError(f"the Hugging Face {model_type} model uses what our model does not "
                         "implement: " + "; ".join(problems))
    L, positions = hf_cfg.num_hidden_layers, hf_cfg.max_position_embeddings
    return by_type[model_type], ModelConfig(
        num_layers=L, hidden_size=hf_cfg.hidden_size,
        num_attention_heads=hf_cfg.num_attention_heads,
        intermediate_size=hf_cfg.intermediate_size, seq_length=positions,
        max_position_embeddings=positions, padded_vocab_size=hf_cfg.vocab_size,
        pos_emb="rotary", rotary_emb_base=theta,
        tied_embeddings=bool(hf_cfg.tie_word_embeddings), attention_types=("global",) * L, **own)


def canonical_from_hf(state_dict: dict[str, torch.Tensor], hf_cfg
                      ) -> tuple[dict[str, torch.Tensor], ModelConfig]:
    """Our canonical weights and ModelConfig from an HF model's tensors and config (a kind of
    ARCHITECTURES); ValueError as `hf_model_config`, or for tensors that are missing, unexpected
    or of the wrong shape."""
    name, config = hf_model_config(hf_cfg)
    state = dict(state_dict)
    canonical = mapping_module(name).canonical_from_hf(state, config)
    if state:
        raise ValueError(f"the Hugging Face weights hold tensors a {hf_cfg.model_type} model with "
                         f"this config.json does not have: {', '.join(sorted(state)[:8])}"
                         + (f" and {len(state) - 8} more" if len(state) > 8 else ""))
    _check_shapes(canonical, config)
    return canonical, config


def _check_shapes(canonical: dict[str, torch.Tensor], config: ModelConfig) -> None:
    """ValueError unless `canonical` has exactly the tensors and shapes of our model."""
    from megatron.model.gpt import GPTModel
    from megatron.model.partition import canonical_from_module

    with torch.device("meta"):  # shapes only: nothing is allocated or initialised
        expected = canonical_from_module(GPTModel(config).state_dict())
    wrong = [f"{n}: {tuple(canonical[n].shape)}, expected {tuple(t.shape)}"
             for n, t in expected.items() if n in canonical and canonical[n].shape != t.shape]
    missing = sorted(set(expected) - set(canonical))
    extra = sorted(set(canonical) - set(expected))
    if wrong or missing or extra:
        raise ValueError("the Hugging Face weights do not fit the model their config.json "
                         f"describes: wrong shapes {wrong}, missing {missing}, extra {extra}")


def take(state: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """Remove and return HF tensor `name`; ValueError when the weights lack it."""
    if name not in state:
        raise ValueError(f"tensor {name} is missing from the Hugging Face weights")
    return state.pop(name)


def rope_of(hf_cfg) -> tuple[float, float, str]:
    """(rope_theta, partial_rotary_factor, rope_type) of an HF config, transformers 4 or 5."""
    params = getattr(hf_cfg, "rope_parameters", None) or {}
    scaling = getattr(hf_cfg, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(hf_cfg, "rope_theta",
                                             getattr(hf_cfg, "rotary_emb_base", 10000.0)))
    partial = params.get("partial_rotary_factor", getattr(hf_cfg, "rotary_pct", 1.0))
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    return float(theta), float(partial), rope_type or "default"
